# Which UCX meshtrain is built against (included by CMakeLists.txt).
#
# MT_UCX_ROOT (a folder holding include/ucp and lib/libucp.so*, e.g. the libucx/ folder of PyPI's
# libucx-cu13 wheel): headers and libraries come only from there. Debian's UCX 1.13 has no CUDA
# transports; a CUDA-enabled one lets the offload stager copy device memory through UCX
# (comm/host/stage.c). Mixing its headers with another UCX's libraries (or the reverse) would
# misbehave silently, so nothing of the system's UCX is looked at. Without MT_UCX_ROOT, pkg-config's
# ucx, as before.
#
# Sets: MT_UCX_TARGET (what to link), MT_UCX_VERSION, MT_UCX_LIB_DIR, MT_UCX_HAS_CUDA (the
# lib/ucx/libuct_cuda.so* module is there), MT_UCX_PC_LDFLAGS and MT_UCX_PC_VARS (for
# meshtrain.pc).
set(MT_UCX_ROOT "" CACHE PATH
    "UCX installation to build against instead of pkg-config's (include/ucp, lib/libucp.so*)")

if(MT_UCX_ROOT)
  # Found again on every configure: a changed MT_UCX_ROOT must not keep the old root's paths.
  foreach(var MT_UCX_INCLUDE MT_UCX_ucp_LIB MT_UCX_uct_LIB MT_UCX_ucs_LIB MT_UCX_ucm_LIB)
    unset(${var} CACHE)
  endforeach()
  find_path(MT_UCX_INCLUDE ucp/api/ucp_version.h PATHS ${MT_UCX_ROOT}/include NO_DEFAULT_PATH)
  set(MT_UCX_LIBS)
  set(missing)
  if(NOT MT_UCX_INCLUDE)
    list(APPEND missing include/ucp/api/ucp_version.h)
  endif()
  foreach(lib ucp uct ucs ucm)
    find_library(MT_UCX_${lib}_LIB NAMES ${lib} lib${lib}.so.0 PATHS ${MT_UCX_ROOT}/lib
                 NO_DEFAULT_PATH)
    if(MT_UCX_${lib}_LIB)
      list(APPEND MT_UCX_LIBS ${MT_UCX_${lib}_LIB})
    else()
      list(APPEND missing lib/lib${lib}.so)
    endif()
  endforeach()
  if(missing)
    list(JOIN missing ", " missing)
    message(FATAL_ERROR "MT_UCX_ROOT=${MT_UCX_ROOT} is not a UCX installation: it lacks "
                        "${missing} (point it at the folder holding include/ and lib/, e.g. "
                        "the libucx/ folder of an unpacked libucx-cu13 wheel)")
  endif()
  file(STRINGS ${MT_UCX_INCLUDE}/ucp/api/ucp_version.h ver_lines
       REGEX "^#define UCP_API_(MAJOR|MINOR) ")
  string(REGEX REPLACE ".*MAJOR +([0-9]+).*MINOR +([0-9]+).*" "\\1.\\2" MT_UCX_VERSION
         "${ver_lines}")
  if(NOT MT_UCX_VERSION MATCHES "^[0-9]+\\.[0-9]+$")
    message(FATAL_ERROR "MT_UCX_ROOT=${MT_UCX_ROOT}: cannot read UCP_API_MAJOR/MINOR from "
                        "${MT_UCX_INCLUDE}/ucp/api/ucp_version.h")
  endif()
  if(MT_UCX_VERSION VERSION_LESS 1.10)
    message(FATAL_ERROR "MT_UCX_ROOT=${MT_UCX_ROOT} holds UCX ${MT_UCX_VERSION}; meshtrain "
                        "needs UCX >= 1.10 (ucp_get_nbx, ucp_request_param_t)")
  endif()
  add_library(mt_ucx INTERFACE IMPORTED)
  set_target_properties(mt_ucx PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${MT_UCX_INCLUDE}
                                          INTERFACE_LINK_LIBRARIES "${MT_UCX_LIBS}")
  set(MT_UCX_TARGET mt_ucx)
  get_filename_component(MT_UCX_LIB_DIR ${MT_UCX_ucp_LIB} DIRECTORY)
  # The programs must load this UCX, not the system's libucp.so.0 (same soname), even where
  # LD_LIBRARY_PATH names the system's folder (scripts/gpu-deps-env does, for the bundled
  # Debian UCX): a DT_RPATH comes before LD_LIBRARY_PATH, a DT_RUNPATH after it.
  list(APPEND CMAKE_BUILD_RPATH ${MT_UCX_LIB_DIR})
  add_link_options(LINKER:--disable-new-dtags)
  set(MT_UCX_WHERE "MT_UCX_ROOT=${MT_UCX_ROOT}")
  set(MT_UCX_PC_VARS "ucxlibdir=${MT_UCX_LIB_DIR}\n")
  set(MT_UCX_PC_LDFLAGS "-L\${ucxlibdir}" -lucp -luct -lucs -lucm)
  unset(missing)
  unset(ver_lines)
else()
  pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx>=1.10)
  set(MT_UCX_TARGET PkgConfig::UCX)
  set(MT_UCX_VERSION ${UCX_VERSION})
  set(MT_UCX_LIB_DIR ${UCX_LIBDIR})
  set(MT_UCX_WHERE "pkg-config (${UCX_LIBDIR})")
  set(MT_UCX_PC_VARS "")
  set(MT_UCX_PC_LDFLAGS ${UCX_LDFLAGS})
endif()

# UCX loads its transports from <folder of libucs>/ucx: cuda_copy (and gdr_copy, cuda_ipc) live
# in libuct_cuda. Whether it can actually copy CUDA memory is asked again at run time
# (ucp_context_query): the module also needs the driver.
file(GLOB MT_UCX_CUDA_MODULE ${MT_UCX_LIB_DIR}/ucx/libuct_cuda.so*)
if(MT_UCX_CUDA_MODULE)
  set(MT_UCX_HAS_CUDA ON)
else()
  set(MT_UCX_HAS_CUDA OFF)
endif()
message(STATUS "meshtrain: UCX ${MT_UCX_VERSION} from ${MT_UCX_WHERE}; CUDA transports "
               "(lib/ucx/libuct_cuda.so) ${MT_UCX_HAS_CUDA}")
