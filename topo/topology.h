/* Internal: the machine model every topology source (hwloc XML, NCCL XML, later live discovery)
 * fills in, and that classification, reports and binding read. Plain arrays so that readers can
 * walk them directly; indices (not pointers) link entries so that arrays may grow. */
#ifndef MT_TOPO_TOPOLOGY_H
#define MT_TOPO_TOPOLOGY_H

#include <meshtrain/status.h>

#include <stddef.h>
#include <stdint.h>

/* Longest PCI bus id kept ("0000:83:00.0", or NCCL's 7-digit "fffffff:ff:ff.0"), with NUL. */
#define MT_TOPO_BUSID_MAX 20
/* The hard limit on a topology file, so that a runaway input fails early instead of ballooning. */
#define MT_TOPO_FILE_MAX ((size_t)64 << 20)

/* Longest CPU architecture or vendor string kept, with NUL. */
#define MT_TOPO_CPU_STR_MAX 32
/* Longest PCIe link speed string kept ("32.0 GT/s PCIe"), with NUL. */
#define MT_TOPO_LINK_SPEED_MAX 32

/* A CPU's identity as NCCL's <cpu arch vendor familyid modelid> records it, which NCCL needs for
 * every <cpu> it uses (arch; on x86 the vendor; on Intel also family and model). "" and -1 where
 * the source does not say: nothing is guessed. */
typedef struct mt_topo_cpu_id {
    char arch[MT_TOPO_CPU_STR_MAX];   /* NCCL's spelling: "x86_64", "arm64", "ppc64" */
    char vendor[MT_TOPO_CPU_STR_MAX]; /* the CPUID vendor string: "GenuineIntel", "AuthenticAMD" */
    int family; /* NCCL's convention: CPUID base family + (extended family << 4) */
    int model;  /* CPUID base model + (extended model << 4) */
} mt_topo_cpu_id;

/* A package or NUMA node: its OS id and its CPUs as a cpu list ("0-47,96-143"). */
typedef struct mt_topo_cpuset {
    int id;
    char *cpus;
    mt_topo_cpu_id cpu; /* set on NUMA nodes (what an NCCL <cpu> describes); unknown elsewhere */
} mt_topo_cpuset;

typedef enum mt_topo_pci_kind {
    MT_TOPO_PCI_HOST_BRIDGE, /* bus_id is "dddd:bb", its domain and first downstream bus */
    MT_TOPO_PCI_BRIDGE,
    MT_TOPO_PCI_DEVICE,
} mt_topo_pci_kind;

typedef struct mt_topo_pci {
    char bus_id[MT_TOPO_BUSID_MAX];
    mt_topo_pci_kind kind;
    int parent;         /* index into pci[], -1 at the top of a tree */
    uint32_t pci_class; /* 24-bit class code (0x030200); hwloc's 16-bit class is shifted left 8 */
    int numa;           /* NUMA node id, -1 when unknown */
    /* The PCIe link above the entry, as the source gives it. NCCL files name the per-lane rate and
     * the lane count (link_speed "16.0 GT/s PCIe" as NCCL wrote it, "" unknown; link_width -1
     * unknown or empty); hwloc records only the link's total data rate (link_gbps, GB/s, 0
     * unknown), which several rate x width pairs give, so it is kept as such. */
    char link_speed[MT_TOPO_LINK_SPEED_MAX];
    int link_width;
    float link_gbps;
} mt_topo_pci;

typedef enum mt_topo_link_kind {
    MT_TOPO_LINK_GPU,    /* a direct link to another GPU of the topology */
    MT_TOPO_LINK_SWITCH, /* into an NVSwitch, visible or not */
    MT_TOPO_LINK_SELF,   /* a file naming the GPU itself: kept as written, flagged */
    MT_TOPO_LINK_OTHER,  /* a CPU or another endpoint (POWER8/9 NVLink to the CPU) */
} mt_topo_link_kind;

typedef struct mt_topo_nvlink {
    char target[MT_TOPO_BUSID_MAX]; /* the peer's bus id, or "switch" for an unnamed switch */
    mt_topo_link_kind kind;
    int count;
} mt_topo_nvlink;

typedef struct mt_topo_gpu {
    int index; /* CUDA index where the source knows it, else PCI bus order */
    char bus_id[MT_TOPO_BUSID_MAX];
    char *name;
    int numa;   /* -1 when unknown */
    char *cpus; /* cpu list of the CPUs nearest the GPU; "" when unknown */
    int pci;    /* index into pci[], -1 when the source has no PCI entry */
    mt_topo_nvlink *links;
    size_t n_links;
    int nvlink_known; /* 0: the source says nothing about NVLink (not "no links") */
} mt_topo_gpu;

typedef struct mt_topo_nic {
    char *name;                     /* "mlx5_0"; "" when the source gives only a PCI entry */
    char bus_id[MT_TOPO_BUSID_MAX]; /* "" when unknown */
    int numa;
    int64_t speed_mbps; /* -1 when unknown */
    int pci;
    /* 1: a device collective libraries use for inter-host traffic (an OpenFabrics/RDMA device, an
     * InfiniBand-class PCI function, or a network NCCL listed as <net>); 0: a plain network
     * interface. When a machine has any of the former, mt_topo_finish drops the latter, so that
     * NIC numbering, the matrix and "nearest NIC" speak of the devices traffic will use (an AWS
     * p5 shows its 32 EFA devices, not also the 32 ENA interfaces next to them). */
    int fabric;
} mt_topo_nic;

typedef struct mt_topo_switch {
    char bus_id[MT_TOPO_BUSID_MAX];
    int pci;
} mt_topo_switch;

typedef struct mt_topo {
    char *source; /* the file path, or "live" */
    mt_topo_cpuset *packages;
    size_t n_packages;
    mt_topo_cpuset *numa;
    size_t n_numa;
    mt_topo_cpuset *cores; /* each physical core: id = its NUMA node (-1 unknown), cpus = its PUs */
    size_t n_cores;        /* physical cores; 0 when the source does not say (NCCL XML) */
    size_t n_pus;   /* hardware threads (hwloc PUs); 0 when the source does not say */
    mt_topo_pci *pci;
    size_t n_pci;
    mt_topo_gpu *gpus; /* sorted by index after loading */
    size_t n_gpus;
    mt_topo_nic *nics;
    size_t n_nics;
    mt_topo_switch *switches;
    size_t n_switches;
    /* hwloc's "NVLinkBandwidth" distances, as recorded: n x n values (MB/s), row-major, and the
     * label of each object (a PCI bus id, or "Package:N"). n is 0 when absent. */
    size_t nvlink_bw_n;
    uint64_t *nvlink_bw;
    char **nvlink_bw_labels;
    /* Why NVLink is unknown for some or all GPUs (gpus[].nvlink_known == 0), as one sentence
     * starting "NVLink unknown", for reports; NULL when every GPU's NVLink is known or there is
     * no GPU. Set with mt_topo_set_nvlink_note. */
    char *nvlink_note;
} mt_topo;

/* Loads a topology file, hwloc XML (root <topology>) or NCCL topology XML (root <system>),
 * detected from its root element. Missing file: MT_ERR_NOT_FOUND; a directory, an oversized
 * or malformed file: MT_ERR_INVALID_ARG; unreadable: MT_ERR_IO. */
mt_status mt_topo_load_file(const char *path, mt_topo **out);

/* Discovers this machine (source "live"): packages, NUMA nodes, cores, PUs, the PCI tree, NICs
 * and NVIDIA GPUs through hwloc; where there are GPUs, numbers them by CUDA index (dropping those
 * CUDA_VISIBLE_DEVICES hides) and reads their NVLinks from NVML, loaded at run time. Without
 * NVML the GPUs' NVLink stays unknown and nvlink_note says why. */
mt_status mt_topo_discover(mt_topo **out);

/* Frees a topology and everything it owns; NULL is ignored. */
void mt_topo_destroy(mt_topo *topo);

/* ---- building blocks for the loaders -------------------------------------------------------- */

mt_status mt_topo_create(const char *source, mt_topo **out);
mt_status mt_topo_add_cpuset(mt_topo *t, int is_package, int id, const char *cpus);
/* Adds a physical core: the NUMA node it belongs to (-1 unknown) and its PUs as a cpu list. */
mt_status mt_topo_add_core(mt_topo *t, int numa, const char *cpus);
mt_status mt_topo_add_pci(mt_topo *t, const char *bus_id, mt_topo_pci_kind kind, int parent,
                          uint32_t pci_class, int numa, int *index_out);
/* Sets the PCIe link of pci[pci] (see mt_topo_pci): speed NULL leaves it unknown, width -1 and
 * gbps 0 likewise. MT_ERR_INVALID_ARG when speed is longer than MT_TOPO_LINK_SPEED_MAX - 1. */
mt_status mt_topo_pci_set_link(mt_topo *t, int pci, const char *speed, int width, float gbps);
/* Sets a NUMA node's CPU identity (see mt_topo_cpu_id): arch in any common spelling ("aarch64",
 * "ppc64le") is stored in NCCL's; NULL strings and -1 numbers leave that part unknown.
 * MT_ERR_INVALID_ARG when a string does not fit MT_TOPO_CPU_STR_MAX. */
mt_status mt_topo_set_cpu_id(mt_topo_cpuset *set, const char *arch, const char *vendor, int family,
                             int model);
/* NCCL's name for a CPU architecture ("aarch64" -> "arm64", "ppc64le" -> "ppc64", "amd64" ->
 * "x86_64"); any other name is returned unchanged. */
const char *mt_topo_arch_nccl(const char *arch);
mt_status mt_topo_add_gpu(mt_topo *t, int index, const char *bus_id, const char *name, int numa,
                          const char *cpus, int pci, mt_topo_gpu **out);
mt_status mt_topo_gpu_add_link(mt_topo *t, mt_topo_gpu *gpu, const char *target,
                               mt_topo_link_kind kind, int count);
mt_status mt_topo_add_nic(mt_topo *t, const char *name, const char *bus_id, int numa,
                          int64_t speed_mbps, int pci, int fabric);
mt_status mt_topo_add_switch(mt_topo *t, const char *bus_id, int pci);
/* Gives GPUs without a known index (-1) the next indices in PCI bus order, checks that indices
 * are unique and sorts gpus[] by index; drops plain network NICs when fabric NICs exist. */
mt_status mt_topo_finish(mt_topo *t);

/* Replaces t->nvlink_note with the formatted sentence; fmt NULL clears it. */
mt_status mt_topo_set_nvlink_note(mt_topo *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Forgets a GPU's NVLinks (links freed, nvlink_known = 0), before a better source refills them. */
void mt_topo_gpu_clear_links(mt_topo_gpu *gpu);
/* Removes gpus[pos] (and what it owns) from the model, keeping the others in order. */
void mt_topo_drop_gpu(mt_topo *t, size_t pos);
/* Writes a PCI bus id in the model's spelling, "dddd:bb:dd.f" in lower case, whatever the source
 * wrote: CUDA's "0000:3B:00.0", NVML's "00000000:3B:00.0", a domain-less "3b:00.0" (domain 0).
 * A domain above 0xffff keeps its digits. MT_ERR_INVALID_ARG when in is not a bus id. */
mt_status mt_topo_busid_canon(const char *in, char out[MT_TOPO_BUSID_MAX]);

/* Writes a bitmap (32-bit words, least significant first) as a cpu list into a new string. */
mt_status mt_topo_cpulist(const uint32_t *words, size_t n_words, char **out);

/* CPU numbers in the cpu lists topology files carry (NCCL affinity masks, mt_* attributes) stay
 * below this: Linux itself stops at 8192, and a bound keeps a damaged list from ballooning. */
#define MT_TOPO_CPUS_MAX 32768

/* The one reader of cpu lists ("0-23,48-71"; "" is empty; a trailing ',' is allowed): reads the
 * item at *p, plain decimals "lo" or "lo-hi" with lo <= hi <= max, and moves *p past it and its
 * ','. Returns 1 for an item, 0 at the end of the list, -1 when the list is malformed there. */
int mt_topo_cpulist_next(const char **p, long max, long *lo, long *hi);

/* Parses a cpu list into a bitmap of n_words 32-bit words (*max_cpu: the highest CPU, -1 for
 * none). MT_ERR_INVALID_ARG when malformed or naming a CPU of n_words * 32 or above. */
mt_status mt_topo_cpulist_parse(const char *list, uint32_t *words, size_t n_words, int *max_cpu);

/* Writes list with every CPU shifted by k into out (size bytes). MT_ERR_INVALID_ARG when list is
 * malformed, a shifted CPU leaves [0, MT_TOPO_CPUS_MAX) or the result does not fit. */
mt_status mt_topo_cpulist_shift(const char *list, int k, char *out, size_t size);

/* The loaders behind mt_topo_load_file, from a buffer of len bytes plus a terminating NUL; path
 * is only used in messages and as the source. */
mt_status mt_topo_load_nccl_xml(const char *path, const char *buf, size_t len, mt_topo **out);
mt_status mt_topo_load_hwloc_xml(const char *path, const char *buf, size_t len, mt_topo **out);

#endif
