/*
 * commands.h -- the subcommands of the `kvattn` tool. Each takes the whole argv (argv[1] is the
 * subcommand's name) and returns the process exit status.
 */
#ifndef KVA_TOOLS_COMMANDS_H
#define KVA_TOOLS_COMMANDS_H

int kvattn_cmd_run(int argc, char **argv);   /* serving simulation (cmd_run.c) */
int kvattn_cmd_bench(int argc, char **argv); /* kernel benchmarks (cmd_bench.c) */
int kvattn_cmd_check(int argc, char **argv); /* one shape vs the float64 reference (cmd_check.c) */

#endif
