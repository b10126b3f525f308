/* meshtrain status codes and the last-error message.
 *
 * Every fallible function returns mt_status; MT_OK is 0. On failure the calling thread's last
 * error holds one human sentence with context (what failed, on which rank, which peer or file).
 */
#ifndef MESHTRAIN_STATUS_H
#define MESHTRAIN_STATUS_H

#include <meshtrain/api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_status {
    MT_OK = 0,
    MT_ERR_INVALID_ARG,   /* a bad argument, option or input value */
    MT_ERR_OUT_OF_MEMORY, /* a device or host allocation did not fit */
    MT_ERR_TIMEOUT,       /* a wait ran past its deadline (MT_TIMEOUT_S) */
    MT_ERR_IO,            /* a file or socket operation failed */
    MT_ERR_PROTOCOL,      /* a peer sent something malformed or unexpected */
    MT_ERR_MISMATCH,      /* processes disagree: job id, version, world size, ... */
    MT_ERR_NOT_FOUND,     /* a key, file or device does not exist */
    MT_ERR_UNSUPPORTED,   /* not available in this build or on this machine */
    MT_ERR_COMM,          /* the transport (UCX, NCCL) reported a failure */
    MT_ERR_PEER_LOST,     /* a peer closed its connection or stopped answering */
    MT_ERR_SYSTEM,        /* an operating system call failed */
    MT_ERR_INTERNAL,      /* a bug in meshtrain */
    MT_STATUS_COUNT
} mt_status;

/* Short name of a status code, e.g. "timeout". Never NULL. */
MT_API const char *mt_status_str(mt_status status);

/* The calling thread's last error message ("" when none). Valid until the thread's next error. */
MT_API const char *mt_last_error(void);

/* Clears the calling thread's last error, and with it the record that the program is failing
 * (mt_error_set): call it after handling an error, so that mt_finalize waits for the other ranks
 * as usual. A failed collective stays recorded. */
MT_API void mt_clear_error(void);

/* Sets the calling thread's last error, for code outside the library (a module's forward, a
 * hook, a program's own checks), and returns status: `return mt_error_set(MT_ERR_INVALID_ARG,
 * "token %d is outside the vocabulary", t);`. The message gets the rank prefix, and a module's
 * failure joins it to the module's context ("forward of module 'fc1': token 300 is ..."). It
 * also records that the program is failing, so that mt_finalize does not wait for the other
 * ranks (see runtime.h); a later successful mt_module_forward / mt_module_backward of a root
 * module clears that record. */
MT_API mt_status mt_error_set(mt_status status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Evaluates a call returning mt_status and returns its status from the enclosing function when it
 * is not MT_OK. */
#define MT_TRY(call)                                                                                \
    do {                                                                                           \
        mt_status mt_try_status_ = (call);                                                         \
        if (mt_try_status_ != MT_OK) return mt_try_status_;                                        \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
