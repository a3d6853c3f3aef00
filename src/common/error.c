/* error.c -- status names and the thread-local last-error message. */
#include "internal.h"

#include <stdio.h>

#include <string.h>

static _Thread_local char last_error[8192]; /* room for the first errors of a variant's compile log */
static _Thread_local const char *api_name;

void kva__set_api(const char *name) { api_name = name; }
const char *kva__api(void) { return api_name ? api_name : "kvattn"; }
const char *kva__caller(const char *func) {
    bool internal = strncmp(func, "kva_", 4) != 0 || strncmp(func, "kva__", 5) == 0;
    return internal ? kva__api() : func;
}

const char *kva_status_str(kva_status status) {
    switch (status) {
    case KVA_OK: return "KVA_OK";
    case KVA_ERR_INVALID_ARG: return "KVA_ERR_INVALID_ARG";
    case KVA_ERR_BAD_SHAPE: return "KVA_ERR_BAD_SHAPE";
    case KVA_ERR_UNSUPPORTED: return "KVA_ERR_UNSUPPORTED";
    case KVA_ERR_OUT_OF_RANGE: return "KVA_ERR_OUT_OF_RANGE";
    case KVA_ERR_NO_SPACE: return "KVA_ERR_NO_SPACE";
    case KVA_ERR_WORKSPACE_TOO_SMALL: return "KVA_ERR_WORKSPACE_TOO_SMALL";
    case KVA_ERR_NOT_BUILT: return "KVA_ERR_NOT_BUILT";
    case KVA_ERR_DEVICE: return "KVA_ERR_DEVICE";
    case KVA_ERR_OUT_OF_MEMORY: return "KVA_ERR_OUT_OF_MEMORY";
    case KVA_ERR_BAD_STATE: return "KVA_ERR_BAD_STATE";
    }
    return "KVA_ERR_UNKNOWN";
}

const char *kva_last_error(void) { return last_error; }

kva_status kva__fail(kva_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}
