/* env_knob.c -- see env_knob.h. */
#include "env_knob.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_small_decimal(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 9) return false;
    for (size_t i = 0; i < n; ++i)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

kva_status kva__env_knob(const char *call, const char *name, const char *const *choices, const char **value) {
    *value = NULL;
    const char *v = getenv(name);
    if (!v || !*v) return KVA_OK;
    char list[160] = "";
    for (int i = 0; choices[i]; ++i) {
        const bool number = strcmp(choices[i], "#") == 0;
        if (number ? is_small_decimal(v) : strcmp(choices[i], v) == 0) {
            *value = v;
            return KVA_OK;
        }
        const size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", number ? "a number >= 0" : choices[i]);
    }
    return kva__fail(KVA_ERR_UNSUPPORTED, "%s: %s=%.32s is not one of: %s", call, name, v, list);
}
