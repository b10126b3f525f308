/* A minimal test harness: CHECK records a failure with file:line and goes on; a test program
 * ends with `return check_report("name");`, which prints "N passed, N failed" and returns the
 * exit code. */
#ifndef MT_TESTS_CHECK_H
#define MT_TESTS_CHECK_H

#include <meshtrain/status.h>

#include <stdio.h>
#include <string.h>

static int check_passed_;
static int check_failed_;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed_++;                                                                       \
        } else {                                                                                   \
            check_failed_++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed_++;                                                                       \
        } else {                                                                                   \
            check_failed_++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Checks that a call returned MT_OK, printing the last error otherwise. */
#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        mt_status check_s_ = (call);                                                               \
        CHECK_MSG(check_s_ == MT_OK, "%s: %s", mt_status_str(check_s_), mt_last_error());          \
    } while (0)

/* Checks that a call returned status and that its error message holds every word given. */
#define CHECK_ERR(call, status, ...)                                                               \
    do {                                                                                           \
        mt_status check_s_ = (call);                                                               \
        CHECK_MSG(check_s_ == (status), "got %s (%s)", mt_status_str(check_s_), mt_last_error());  \
        const char *check_words_[] = {__VA_ARGS__};                                                \
        for (size_t w_ = 0; w_ < sizeof check_words_ / sizeof *check_words_; w_++)                 \
            CHECK_MSG(strstr(mt_last_error(), check_words_[w_]) != NULL, "'%s' not in: %s",       \
                      check_words_[w_], mt_last_error());                                          \
    } while (0)

static inline int check_report(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}

#endif
