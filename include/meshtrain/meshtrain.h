/* meshtrain: train models larger than one accelerator (TP inside a host, FSDP across hosts).
 * Including this header brings in every public module. */
#ifndef MESHTRAIN_MESHTRAIN_H
#define MESHTRAIN_MESHTRAIN_H

#include <meshtrain/checkpoint.h>
#include <meshtrain/comm.h>
#include <meshtrain/device.h>
#include <meshtrain/dtype.h>
#include <meshtrain/log.h>
#include <meshtrain/fsdp.h>
#include <meshtrain/host_memory.h>
#include <meshtrain/gpt.h>
#include <meshtrain/init.h>
#include <meshtrain/memory.h>
#include <meshtrain/mesh.h>
#include <meshtrain/mlp.h>
#include <meshtrain/module.h>
#include <meshtrain/ops.h>
#include <meshtrain/optim.h>
#include <meshtrain/recompute.h>
#include <meshtrain/runtime.h>
#include <meshtrain/stage.h>
#include <meshtrain/status.h>
#include <meshtrain/store.h>
#include <meshtrain/tp.h>
#include <meshtrain/version.h>

#endif
