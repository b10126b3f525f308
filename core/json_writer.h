/* Internal: a small streaming JSON writer (reports, metrics). Commas, nesting and string escaping
 * are handled here so that callers only say what comes next. Output is pretty-printed: each
 * member or element of an object/array on its own line, except in arrays opened with
 * mt_json_begin_array_inline, which stay on one line (matrix rows, groups of indices).
 *
 * Errors (a write failure, nesting too deep, a value where a key is due) are sticky: later calls
 * do nothing and mt_json_end reports the first one. */
#ifndef MT_CORE_JSON_WRITER_H
#define MT_CORE_JSON_WRITER_H

#include <meshtrain/status.h>

#include <stdint.h>
#include <stdio.h>

#define MT_JSON_MAX_DEPTH 32

typedef struct mt_json {
    FILE *out;
    int depth;
    int count[MT_JSON_MAX_DEPTH];    /* members/elements written at each level */
    char is_object[MT_JSON_MAX_DEPTH];
    char is_inline[MT_JSON_MAX_DEPTH];
    int after_key; /* a key was written; its value comes next */
    mt_status error;
} mt_json;

/* Starts writing one JSON document to out. */
void mt_json_init(mt_json *j, FILE *out);

void mt_json_begin_object(mt_json *j);
void mt_json_end_object(mt_json *j);
void mt_json_begin_array(mt_json *j);
/* An array whose elements stay on one line. */
void mt_json_begin_array_inline(mt_json *j);
void mt_json_end_array(mt_json *j);

/* The key of the next object member. */
void mt_json_key(mt_json *j, const char *key);

/* A string value: quotes, backslashes and control characters escaped; bytes that are not valid
 * UTF-8 become U+FFFD, so that the document is always valid JSON. NULL writes null. */
void mt_json_string(mt_json *j, const char *s);
void mt_json_int(mt_json *j, int64_t v);
/* A finite double ("%.17g"); NaN and infinities, which JSON cannot express, write null. */
void mt_json_double(mt_json *j, double v);
void mt_json_bool(mt_json *j, int v);
void mt_json_null(mt_json *j);

/* Ends the document (a final newline) and returns the first error: MT_ERR_INVALID_ARG for
 * misuse (unbalanced nesting, a missing key), MT_ERR_IO when writing failed. */
mt_status mt_json_end(mt_json *j);

#endif
