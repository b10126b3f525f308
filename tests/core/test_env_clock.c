/* core/env.h (numeric MT_* variables refused out of range, with the variable, its value and the
 * range in the message) and core/clock.h (condition variables with monotonic deadlines). */
#include "check.h"

#include "core/clock.h"
#include "core/env.h"

#include <meshtrain/status.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void test_int(void) {
    long long v = -1;
    unsetenv("MT_TEST_N");
    CHECK(mt_env_int("MT_TEST_N", 1, 4096, 8, "a window", &v) == MT_OK && v == 8);
    setenv("MT_TEST_N", "", 1);
    CHECK(mt_env_int("MT_TEST_N", 1, 4096, 8, "a window", &v) == MT_OK && v == 8);
    setenv("MT_TEST_N", "4096", 1);
    CHECK(mt_env_int("MT_TEST_N", 1, 4096, 8, "a window", &v) == MT_OK && v == 4096);
    /* What once wrapped to a window of 0: refused, naming variable, value and range. */
    const char *bad[] = {"4294967296", "0", "-3", "abc", "12x", "99999999999999999999", " 5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("MT_TEST_N", bad[i], 1);
        v = -1;
        mt_status st = mt_env_int("MT_TEST_N", 1, 4096, 8, "a window", &v);
        CHECK_MSG(st == MT_ERR_INVALID_ARG, "MT_TEST_N=%s accepted", bad[i]);
        char want[128];
        snprintf(want, sizeof want, "MT_TEST_N=%s is not an integer in 1..4096 (a window)", bad[i]);
        CHECK_MSG(strstr(mt_last_error(), want) != NULL, "message: %s", mt_last_error());
    }
    unsetenv("MT_TEST_N");
}

static void test_seconds_and_bytes(void) {
    double s = 0;
    setenv("MT_TEST_S", "2.5", 1);
    CHECK(mt_env_seconds("MT_TEST_S", 0, 10, 3, "a grace", &s) == MT_OK && s == 2.5);
    const char *bad[] = {"-1", "11", "nan", "inf", "1e999", "2s"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("MT_TEST_S", bad[i], 1);
        CHECK_MSG(mt_env_seconds("MT_TEST_S", 0, 10, 3, "a grace", &s) == MT_ERR_INVALID_ARG,
                  "MT_TEST_S=%s accepted", bad[i]);
        CHECK(strstr(mt_last_error(), "is not a number of seconds in 0..10 (a grace)") != NULL);
    }
    unsetenv("MT_TEST_S");
    size_t b = 0;
    setenv("MT_TEST_B", "4MiB", 1);
    CHECK(mt_env_bytes("MT_TEST_B", 1, (size_t)1 << 30, 7, "a chunk", &b) == MT_OK &&
          b == ((size_t)4 << 20));
    setenv("MT_TEST_B", "2GiB", 1);
    CHECK(mt_env_bytes("MT_TEST_B", 1, (size_t)1 << 30, 7, "a chunk", &b) == MT_ERR_INVALID_ARG);
    CHECK(strstr(mt_last_error(), "MT_TEST_B=2GiB is not a byte count in 1..1073741824") != NULL);
    unsetenv("MT_TEST_B");
    CHECK(mt_env_bytes("MT_TEST_B", 1, 10, 7, "a chunk", &b) == MT_OK && b == 7);
}

static void test_monotonic_cond(void) {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv;
    CHECK(mt_cond_init_monotonic(&cv) == 0);
    double t0 = mt_clock_now_s();
    struct timespec until = mt_clock_deadline(0.2);
    pthread_mutex_lock(&mu);
    int rc = 0;
    while (rc != ETIMEDOUT) rc = pthread_cond_timedwait(&cv, &mu, &until);
    pthread_mutex_unlock(&mu);
    double waited = mt_clock_now_s() - t0;
    /* A CLOCK_REALTIME condition variable given a monotonic deadline (seconds since boot) would
     * return at once, the deadline being decades in the past. */
    CHECK_MSG(waited >= 0.19 && waited < 5.0, "waited %.3f s for a 0.2 s deadline", waited);
    pthread_cond_destroy(&cv);
    struct timespec now = mt_clock_deadline(0), far = mt_clock_deadline(1e30);
    CHECK(far.tv_sec > now.tv_sec && far.tv_nsec < 1000000000L);
}

int main(void) {
    test_int();
    test_seconds_and_bytes();
    test_monotonic_cond();
    return check_report("test_env_clock");
}
