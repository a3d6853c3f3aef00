/*
 * isa_table.c -- this ISA variant's kernel table (cpu_isa.h), kva__<variant>_kernels. Compiled
 * with the rest of src/cpu/kernels/ once per variant.
 */
#include "simd.h"
#include "../cpu_isa.h"

#define KVA__STR2(x) #x
#define KVA__STR(x) KVA__STR2(x)

const kva__cpu_kernels KVA__ISA_FN(kernels) = {
    KVA__STR(KVA_ISA),
    KVA__ISA_FN(decode_run),
    KVA__ISA_FN(prefill_scratch_bytes),
    KVA__ISA_FN(prefill_task_run),
};
