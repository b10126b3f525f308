/* Memory categories, and byte counts parsed and formatted for people. */
#include "check.h"

#include <meshtrain/memory.h>

#include <stdint.h>
#include <string.h>

static void check_parse(const char *text, size_t expected) {
    size_t got = 0;
    mt_status st = mt_parse_bytes(text, &got);
    CHECK_MSG(st == MT_OK, "\"%s\": %s", text, mt_last_error());
    CHECK_MSG(got == expected, "\"%s\" -> %zu, expected %zu", text, got, expected);
}

/* A rejected input leaves out untouched, and the message quotes the input and says why. */
static void check_reject(const char *text, const char *why) {
    size_t got = 777;
    mt_status st = mt_parse_bytes(text, &got);
    CHECK_MSG(st == MT_ERR_INVALID_ARG, "\"%s\" was accepted as %zu", text, got);
    CHECK_MSG(got == 777, "\"%s\" changed out", text);
    CHECK_MSG(strstr(mt_last_error(), text) != NULL, "message does not quote \"%s\": %s", text,
              mt_last_error());
    CHECK_MSG(strstr(mt_last_error(), why) != NULL, "message for \"%s\" does not say \"%s\": %s",
              text, why, mt_last_error());
}

static void test_parse(void) {
    check_parse("0", 0);
    check_parse("1048576", 1048576);
    check_parse("512B", 512);
    check_parse("1KiB", 1024);
    check_parse("512MiB", 512ull << 20);
    check_parse("512 MiB", 512ull << 20);
    check_parse("2GiB", 2ull << 30);
    check_parse("3 TiB", 3ull << 40);
    check_parse("1KB", 1000);
    check_parse("5 MB", 5000000);
    check_parse("2GB", 2000000000ull);
    check_parse("1TB", 1000000000000ull);
    check_parse("1.5GiB", 3ull << 29);
    check_parse("0.5 KiB", 512);
    check_parse("2gib", 2ull << 30);
    check_parse("  64MiB  ", 64ull << 20);
    check_parse("18446744073709551615", SIZE_MAX);
    check_parse("16777215TiB", 16777215ull << 40);

    check_reject("-1", "negative");
    check_reject("-2GiB", "negative");
    check_reject("", "number");
    check_reject("abc", "number");
    check_reject("GiB", "number");
    check_reject("12abc", "unknown unit");
    check_reject("12 GiBs", "unknown unit");
    check_reject("12G", "unknown unit");
    check_reject("1 2", "unexpected");
    check_reject("1GiB extra", "unexpected");
    check_reject("1.5", "whole");
    check_reject("1.", "digit");
    check_reject("18446744073709551616", "too large");
    check_reject("16777216TiB", "too large");
    check_reject("99999999999999999999999GiB", "too large");
    size_t out;
    CHECK(mt_parse_bytes(NULL, &out) == MT_ERR_INVALID_ARG);
    CHECK(mt_parse_bytes("1", NULL) == MT_ERR_INVALID_ARG);
}

static void check_format(size_t bytes, const char *expected) {
    char buf[32];
    const char *got = mt_format_bytes(bytes, buf, sizeof buf);
    CHECK_MSG(got == buf && strcmp(buf, expected) == 0, "%zu -> \"%s\", expected \"%s\"", bytes,
              buf, expected);
}

static void test_format(void) {
    check_format(0, "0 B");
    check_format(1023, "1023 B");
    check_format(1024, "1.00 KiB");
    check_format(1536, "1.50 KiB");
    check_format(64ull << 20, "64.00 MiB");
    check_format(3ull << 29, "1.50 GiB");
    check_format((1ull << 20) - 1, "1.00 MiB"); /* not "1024.00 KiB" */
    check_format(5ull << 40, "5.00 TiB");
    char small[4];
    mt_format_bytes(1ull << 30, small, sizeof small); /* truncated, still terminated */
    CHECK(strlen(small) == 3);
}

static void test_categories(void) {
    const char *names[] = {"params", "grads", "optimizer", "activations", "comm", "other"};
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++)
        CHECK_MSG(strcmp(mt_mem_category_name((mt_mem_category)c), names[c]) == 0, "%d: %s", c,
                  mt_mem_category_name((mt_mem_category)c));
    CHECK(strcmp(mt_mem_category_name(MT_MEM_CATEGORY_COUNT), "invalid") == 0);
}

int main(void) {
    test_parse();
    test_format();
    test_categories();
    return check_report("test_memory");
}
