/* Internal: the layout of a rank's flight recorder ring, shared by the library (comm/flight_rec.c,
 * which writes it) and mtrun (tools/mtrun/flightrec.c, which creates the file before the rank
 * starts and reads it, even while the rank is stopped or after it died).
 *
 * The file (/dev/shm/mt-fr-<mtrun pid>-<rank>, mode 0600) is one header followed by `capacity`
 * fixed-size records. Record i of the job's collectives on this rank lives in slot i % capacity.
 *
 * Write protocol (a sequence lock per slot), so that a reader never takes a half-written record
 * for a whole one, whatever instant the rank is stopped at (SIGSTOP, a crash):
 *   - the writer claims id = next++ (atomic), stores lock = 2*id + 1 (odd: being written), a
 *     release fence, the fixed fields, then lock = 2*id + 2 (release);
 *   - the times, the status and the awaited peer are single atomic 64/32-bit fields updated later
 *     (from the progress thread too), each only while lock still reads 2*id + 2, so a reader sees
 *     either the old or the new value of each, never a torn one;
 *   - a reader loads lock (acquire), skips an odd or zero lock, copies the record, loads lock
 *     again after an acquire fence and keeps the copy only when both loads agree.
 * Times are CLOCK_MONOTONIC nanoseconds; the header's anchor (a monotonic and a wall-clock time
 * taken together when the rank attached) turns them into wall-clock times that compare across
 * nodes. */
#ifndef MT_COMM_FLIGHT_REC_FORMAT_H
#define MT_COMM_FLIGHT_REC_FORMAT_H

#include <stdatomic.h>
#include <stdint.h>

/* GCC's ThreadSanitizer does not model the protocol's fences and warns of each (an error with
 * -Werror). What they order is between processes (a rank writes, mtrun reads), where
 * ThreadSanitizer sees nothing; within a rank, writers touch a record only through atomics. */
#if defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic ignored "-Wtsan"
#endif

#define MT_FR_MAGIC UINT64_C(0x314352464d54444d) /* "MDTMFRC1" */
#define MT_FR_VERSION 1
#define MT_FR_GROUP_CAP 40 /* "dp#2": the group's name, '#', its job-wide id */
#define MT_FR_DEFAULT_CAPACITY 2048
#define MT_FR_MAX_CAPACITY (1 << 20)

typedef struct mt_fr_header {
    uint64_t magic;
    uint32_t version;
    uint32_t record_size;        /* sizeof(mt_fr_record), checked by both sides */
    uint32_t capacity;           /* records in the ring */
    int32_t rank;                /* the job rank the file was made for */
    _Atomic int32_t pid;         /* the rank's pid once it attached; 0 before */
    int32_t node;                /* the node rank of the mtrun that made it */
    _Atomic uint64_t anchor_mono_ns; /* set (with the wall anchor) before pid */
    _Atomic uint64_t anchor_wall_ns;
    _Atomic uint64_t next;       /* ids claimed so far: records ever written */
    uint8_t reserved[72];
} mt_fr_header; /* 128 bytes */

typedef struct mt_fr_record {
    _Atomic uint64_t lock;       /* 0 never written; 2*id+1 being written; 2*id+2 written */
    char group[MT_FR_GROUP_CAP]; /* NUL-terminated */
    uint32_t seq;                /* the collective's sequence number in its group */
    int32_t group_size;
    int32_t group_rank;          /* this rank's rank in the group */
    uint8_t op;                  /* mt_op_kind */
    uint8_t dtype;               /* mt_dtype */
    uint16_t reserved0;
    uint64_t bytes;              /* payload (what the group's traffic counters count) */
    _Atomic uint64_t queued_ns, started_ns, completed_ns; /* monotonic; 0: not yet */
    _Atomic int32_t status;      /* mt_status once completed (0: success) */
    _Atomic int32_t waiting_peer; /* group rank the host schedule last waited on, -1 unknown */
    uint8_t reserved[24];
} mt_fr_record; /* 128 bytes */

_Static_assert(sizeof(mt_fr_header) == 128, "flight recorder header layout");
_Static_assert(sizeof(mt_fr_record) == 128, "flight recorder record layout");

#endif
