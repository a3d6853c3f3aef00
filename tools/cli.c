/* cli.c -- option parsing, --help, device selection and timing for the kvattn command; see cli.h. */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *dtype_names[] = {"f32", "f16", "bf16", NULL};
static const char *device_names[] = {"auto", "cpu", "cuda", NULL};

const char *cli_device_name(cli_device device) {
    return (unsigned)device < 3 ? device_names[device] : "?";
}

static int lookup(const char *const *names, const char *value) {
    for (int i = 0; names[i]; ++i)
        if (strcmp(names[i], value) == 0) return i;
    return -1;
}

static int parse_i32(const char *s, int32_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || end == s || *end || v < INT32_MIN || v > INT32_MAX) return -1;
    *out = (int32_t)v;
    return 0;
}

/* "lo:hi" or "n" (= "n:n"). */
static int parse_range(const char *s, int32_t out[2]) {
    const char *colon = strchr(s, ':');
    if (!colon) {
        if (parse_i32(s, &out[0])) return -1;
        out[1] = out[0];
        return 0;
    }
    char lo[64];
    size_t n = (size_t)(colon - s);
    if (n == 0 || n >= sizeof lo) return -1;
    memcpy(lo, s, n);
    lo[n] = 0;
    if (parse_i32(lo, &out[0]) || parse_i32(colon + 1, &out[1])) return -1;
    return out[0] <= out[1] ? 0 : -1;
}

static int set_value(const cli_option *opt, const char *value) {
    switch (opt->kind) {
    case CLI_INT: {
        int32_t v;
        if (parse_i32(value, &v) || v < opt->min_value) return -1;
        *(int32_t *)opt->target = v;
        return 0;
    }
    case CLI_U64: {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(value, &end, 0);
        if (errno || end == value || *end) return -1;
        *(uint64_t *)opt->target = v;
        return 0;
    }
    case CLI_RANGE: {
        int32_t r[2];
        if (parse_range(value, r) || r[0] < opt->min_value) return -1;
        ((int32_t *)opt->target)[0] = r[0];
        ((int32_t *)opt->target)[1] = r[1];
        return 0;
    }
    case CLI_DTYPE: {
        int i = lookup(dtype_names, value);
        if (i < 0) return -1;
        *(kva_dtype *)opt->target = (kva_dtype)i;
        return 0;
    }
    case CLI_DEVICE: {
        int i = lookup(device_names, value);
        if (i < 0) return -1;
        *(cli_device *)opt->target = (cli_device)i;
        return 0;
    }
    case CLI_CHOICE: {
        int i = lookup(opt->choices, value);
        if (i < 0) return -1;
        *(int *)opt->target = i;
        return 0;
    }
    case CLI_FLAG: break;
    }
    return -1;
}

/* The value an option holds now, for --help's "(default ...)". */
static void format_value(const cli_option *opt, char *buf, size_t size) {
    switch (opt->kind) {
    case CLI_INT: snprintf(buf, size, "%d", *(const int32_t *)opt->target); break;
    case CLI_U64: snprintf(buf, size, "%llu", (unsigned long long)*(const uint64_t *)opt->target); break;
    case CLI_RANGE: {
        const int32_t *r = opt->target;
        snprintf(buf, size, "%d:%d", r[0], r[1]);
        break;
    }
    case CLI_DTYPE: snprintf(buf, size, "%s", kva_dtype_name(*(const kva_dtype *)opt->target)); break;
    case CLI_DEVICE: snprintf(buf, size, "%s", cli_device_name(*(const cli_device *)opt->target)); break;
    case CLI_CHOICE: snprintf(buf, size, "%s", opt->choices[*(const int *)opt->target]); break;
    case CLI_FLAG: buf[0] = 0; break;
    }
}

static const char *metavar(const cli_option *opt) {
    switch (opt->kind) {
    case CLI_INT: return "N";
    case CLI_U64: return "N";
    case CLI_RANGE: return "LO:HI";
    case CLI_DTYPE: return "f32|f16|bf16";
    case CLI_DEVICE: return "auto|cpu|cuda";
    case CLI_CHOICE: return "NAME";
    case CLI_FLAG: return "";
    }
    return "";
}

/* Prints text from column `indent` on, breaking lines at spaces before column `width`. */
static void print_wrapped(FILE *out, const char *text, int indent, int width) {
    int col = indent;
    const char *p = text;
    while (*p) {
        size_t word = strcspn(p, " ");
        if (col > indent && col + 1 + (int)word > width) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', out);
            ++col;
        }
        fprintf(out, "%.*s", (int)word, p);
        col += (int)word;
        p += word;
        while (*p == ' ') ++p;
    }
    fputc('\n', out);
}

void cli_print_help(FILE *out, const char *command, const char *summary,
                    const cli_option *options, int num_options) {
    fprintf(out, "usage: kvattn %s [options]\n\n%s\n\noptions:\n", command, summary);
    for (int i = 0; i < num_options; ++i) {
        const cli_option *o = &options[i];
        char flag[64], def[64];
        if (o->kind == CLI_CHOICE) {
            char names[48] = "";
            for (int c = 0; o->choices[c]; ++c) {
                if (c) strncat(names, "|", sizeof names - strlen(names) - 1);
                strncat(names, o->choices[c], sizeof names - strlen(names) - 1);
            }
            snprintf(flag, sizeof flag, "--%s %s", o->name, names);
        } else {
            snprintf(flag, sizeof flag, "--%s %s", o->name, metavar(o));
        }
        format_value(o, def, sizeof def);
        char text[512];
        if (def[0])
            snprintf(text, sizeof text, "%s (default %s)", o->help, def);
        else
            snprintf(text, sizeof text, "%s", o->help);
        fprintf(out, "  %-28s ", flag);
        print_wrapped(out, text, 31, 100);
    }
    fprintf(out, "  %-28s %s\n", "-h, --help", "show this help");
}

cli_parse_result cli_parse(const char *command, const char *summary, const cli_option *options,
                           int num_options, int argc, char **argv, int first) {
    for (int a = first; a < argc; ++a) {
        const char *arg = argv[a];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            cli_print_help(stdout, command, summary, options, num_options);
            return CLI_HELP_SHOWN;
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "kvattn %s: unexpected argument '%s' (see --help)\n", command, arg);
            return CLI_BAD_ARGS;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const cli_option *opt = NULL;
        for (int i = 0; i < num_options; ++i)
            if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0)
                opt = &options[i];
        if (!opt) {
            fprintf(stderr, "kvattn %s: unknown option '%s' (see --help)\n", command, arg);
            return CLI_BAD_ARGS;
        }
        if (opt->kind == CLI_FLAG) {
            if (eq) {
                fprintf(stderr, "kvattn %s: --%s takes no value\n", command, opt->name);
                return CLI_BAD_ARGS;
            }
            *(int *)opt->target = 1;
            continue;
        }
        const char *value = eq ? eq + 1 : (a + 1 < argc ? argv[++a] : NULL);
        if (!value || set_value(opt, value) != 0) {
            fprintf(stderr, "kvattn %s: bad value '%s' for --%s (expected %s", command,
                    value ? value : "", opt->name, metavar(opt));
            if ((opt->kind == CLI_INT || opt->kind == CLI_RANGE) && opt->min_value > INT32_MIN)
                fprintf(stderr, ", at least %d", opt->min_value);
            fprintf(stderr, ")\n");
            return CLI_BAD_ARGS;
        }
    }
    return CLI_PARSED;
}

kva_context *cli_open_context(cli_device device, int32_t threads, int *exit_code) {
    kva_device_type type = KVA_DEVICE_CPU;
    if (device == CLI_DEVICE_CUDA || (device == CLI_DEVICE_AUTO && kva_cuda_available()))
        type = KVA_DEVICE_CUDA;
    kva_context *ctx = NULL;
    kva_status st = kva_context_create(type, 0, &ctx);
    if (st != KVA_OK) {
        fprintf(stderr, "kvattn: cannot use device %s: %s (%s)\n",
                type == KVA_DEVICE_CUDA ? "cuda" : "cpu", kva_last_error(), kva_status_str(st));
        *exit_code = 2;
        return NULL;
    }
    if (type == KVA_DEVICE_CPU && threads > 0) {
        st = kva_context_set_threads(ctx, threads);
        if (st != KVA_OK) {
            fprintf(stderr, "kvattn: --threads %d: %s\n", threads, kva_last_error());
            kva_context_destroy(ctx);
            *exit_code = 2;
            return NULL;
        }
    }
    *exit_code = 0;
    return ctx;
}

double cli_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double cli_median(const double *values, int n) {
    double sorted[4096];
    if (n <= 0) return 0;
    if (n > 4096) n = 4096;
    memcpy(sorted, values, sizeof(double) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

size_t cli_llc_bytes(void) {
    /* sysfs lists every cache level of cpu0; the last unified one with the largest size wins. */
    size_t best = 0;
    for (int idx = 0; idx < 8; ++idx) {
        char path[128], text[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(text, sizeof text, f)) {
            char *end;
            unsigned long long v = strtoull(text, &end, 10);
            if (*end == 'K') v <<= 10;
            else if (*end == 'M') v <<= 20;
            if (v > best) best = (size_t)v;
        }
        fclose(f);
    }
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (best == 0) {
        long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (v > 0) best = (size_t)v;
    }
#endif
    return best;
}
