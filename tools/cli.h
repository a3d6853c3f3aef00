/*
 * cli.h -- the small toolkit every `kvattn` subcommand shares: a table-driven option parser that
 * also prints --help (so the help text can never drift from what is parsed), device selection,
 * a monotonic clock and median helper.
 *
 * An option table is an array of cli_option; each entry names a flag and a typed target that
 * already holds the default. Values are given as `--name value` or `--name=value`.
 */
#ifndef KVA_TOOLS_CLI_H
#define KVA_TOOLS_CLI_H

#include "kvattn.h"

#include <stdint.h>
#include <stdio.h>

typedef enum cli_kind {
    CLI_INT,    /* int32_t *target */
    CLI_U64,    /* uint64_t *target */
    CLI_RANGE,  /* int32_t target[2]: "lo:hi" (inclusive) or a single value "n" */
    CLI_DTYPE,  /* kva_dtype *target: f32 | f16 | bf16 */
    CLI_DEVICE, /* cli_device *target: auto | cpu | cuda */
    CLI_FLAG,   /* int *target set to 1 (no value) */
    CLI_CHOICE  /* int *target = index into choices (NULL-terminated names) */
} cli_kind;

typedef enum cli_device { CLI_DEVICE_AUTO = 0, CLI_DEVICE_CPU = 1, CLI_DEVICE_CUDA = 2 } cli_device;

typedef struct cli_option {
    const char *name;     /* "requests" for --requests */
    cli_kind kind;
    void *target;
    const char *help;
    const char *const *choices; /* CLI_CHOICE only */
    int32_t min_value;    /* CLI_INT / CLI_RANGE: smallest accepted value */
} cli_option;

typedef enum cli_parse_result { CLI_PARSED = 0, CLI_HELP_SHOWN = 1, CLI_BAD_ARGS = 2 } cli_parse_result;

/* Parses argv[first..argc) against the table. Prints --help (with the current defaults) to
 * stdout and returns CLI_HELP_SHOWN for -h/--help; prints a one-line error to stderr and returns
 * CLI_BAD_ARGS for anything unknown or malformed. */
cli_parse_result cli_parse(const char *command, const char *summary, const cli_option *options,
                           int num_options, int argc, char **argv, int first);

void cli_print_help(FILE *out, const char *command, const char *summary,
                    const cli_option *options, int num_options);

const char *cli_device_name(cli_device device);

/* Creates the context the user asked for. "auto" picks CUDA when kva_cuda_available(). On
 * failure prints why (kva_last_error) to stderr and returns NULL; *exit_code is then 2. threads
 * applies to the CPU (0 = all cores). */
kva_context *cli_open_context(cli_device device, int32_t threads, int *exit_code);

/* Seconds on a monotonic clock. */
double cli_now(void);

/* Median of n doubles (sorts a copy of at most 4096 values). */
double cli_median(const double *values, int n);

/* Bytes of the last-level cache, from sysconf or sysfs; 0 if unknown. */
size_t cli_llc_bytes(void);

#endif
