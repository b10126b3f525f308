/* Streaming JSON writer (see core/json_writer.h). */
#include "core/json_writer.h"

#include "core/error.h"
#include "core/utf8.h"

#include <math.h>
#include <string.h>

void mt_json_init(mt_json *j, FILE *out) {
    memset(j, 0, sizeof(*j));
    j->out = out;
}

static void fail(mt_json *j, mt_status s, const char *what) {
    if (j->error != MT_OK) return;
    j->error = s == MT_ERR_IO ? mt_error(s, "JSON output: writing failed")
                              : mt_error(s, "JSON output: %s", what);
}

static void indent(mt_json *j) {
    fputc('\n', j->out);
    for (int i = 0; i < j->depth; i++) fputs("  ", j->out);
}

/* Everything a value or key needs before it: a comma, a line break, checks. */
static int before_value(mt_json *j, int is_key) {
    if (j->error != MT_OK) return 0;
    if (j->depth == 0) {
        if (is_key || j->count[0] > 0) {
            fail(j, MT_ERR_INVALID_ARG, is_key ? "a key outside an object" : "two top-level values");
            return 0;
        }
        j->count[0]++;
        return 1;
    }
    int level = j->depth;
    if (j->is_object[level] && !is_key && !j->after_key) {
        fail(j, MT_ERR_INVALID_ARG, "an object member without a key");
        return 0;
    }
    if (j->after_key) { /* the value of a member: on the key's line */
        if (is_key) {
            fail(j, MT_ERR_INVALID_ARG, "two keys in a row");
            return 0;
        }
        j->after_key = 0;
        return 1;
    }
    if (is_key && !j->is_object[level]) {
        fail(j, MT_ERR_INVALID_ARG, "a key inside an array");
        return 0;
    }
    if (j->count[level]++ > 0) fputs(j->is_inline[level] ? ", " : ",", j->out);
    if (!j->is_inline[level]) indent(j);
    return 1;
}

static void begin(mt_json *j, int object, int inline_) {
    if (!before_value(j, 0)) return;
    if (j->depth + 1 >= MT_JSON_MAX_DEPTH) {
        fail(j, MT_ERR_INVALID_ARG, "nesting deeper than 31 levels");
        return;
    }
    j->depth++;
    j->count[j->depth] = 0;
    j->is_object[j->depth] = (char)object;
    /* inside an inline array everything stays on the line */
    j->is_inline[j->depth] = (char)(inline_ || (j->depth > 1 && j->is_inline[j->depth - 1]));
    fputc(object ? '{' : '[', j->out);
}

static void end(mt_json *j, int object) {
    if (j->error != MT_OK) return;
    if (j->depth == 0 || j->is_object[j->depth] != object || j->after_key) {
        fail(j, MT_ERR_INVALID_ARG, object ? "an unbalanced end of object" : "an unbalanced end of array");
        return;
    }
    int had = j->count[j->depth] > 0, inl = j->is_inline[j->depth];
    j->depth--;
    if (had && !inl) indent(j);
    fputc(object ? '}' : ']', j->out);
}

void mt_json_begin_object(mt_json *j) { begin(j, 1, 0); }
void mt_json_end_object(mt_json *j) { end(j, 1); }
void mt_json_begin_array(mt_json *j) { begin(j, 0, 0); }
void mt_json_begin_array_inline(mt_json *j) { begin(j, 0, 1); }
void mt_json_end_array(mt_json *j) { end(j, 0); }

static void write_string(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', out);
            fputc((int)c, out);
        } else if (c == '\n') {
            fputs("\\n", out);
        } else if (c == '\r') {
            fputs("\\r", out);
        } else if (c == '\t') {
            fputs("\\t", out);
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(out, "\\u%04x", c);
        } else if (c >= 0x80) {
            int n = mt_utf8_len(p);
            if (n == 0) {
                fputs("\\ufffd", out);
                p++;
                continue;
            }
            fwrite(p, 1, (size_t)n, out);
            p += n;
            continue;
        } else {
            fputc((int)c, out);
        }
        p++;
    }
    fputc('"', out);
}

void mt_json_key(mt_json *j, const char *key) {
    if (!before_value(j, 1)) return;
    write_string(j->out, key ? key : "");
    fputs(": ", j->out);
    j->after_key = 1;
}

void mt_json_string(mt_json *j, const char *s) {
    if (!s) {
        mt_json_null(j);
        return;
    }
    if (before_value(j, 0)) write_string(j->out, s);
}

void mt_json_int(mt_json *j, int64_t v) {
    if (before_value(j, 0)) fprintf(j->out, "%lld", (long long)v);
}

void mt_json_double(mt_json *j, double v) {
    if (!isfinite(v)) {
        mt_json_null(j);
        return;
    }
    if (before_value(j, 0)) fprintf(j->out, "%.17g", v);
}

void mt_json_bool(mt_json *j, int v) {
    if (before_value(j, 0)) fputs(v ? "true" : "false", j->out);
}

void mt_json_null(mt_json *j) {
    if (before_value(j, 0)) fputs("null", j->out);
}

mt_status mt_json_end(mt_json *j) {
    if (j->error == MT_OK && (j->depth != 0 || j->after_key || j->count[0] == 0))
        fail(j, MT_ERR_INVALID_ARG, "the document is incomplete");
    if (j->error == MT_OK) {
        fputc('\n', j->out);
        if (fflush(j->out) != 0 || ferror(j->out)) fail(j, MT_ERR_IO, NULL);
    }
    return j->error;
}
