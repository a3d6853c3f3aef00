/*
 * env_knob.h -- environment variables that steer kernel choices for tests and comparisons
 * (KVA_DECODE_GROUP_PATH, KVA_PREFILL_PERSISTENT, ...). A value the library does not know must
 * not silently run the default: a comparison would then report the wrong kernel's numbers.
 */
#ifndef KVA_ENV_KNOB_H
#define KVA_ENV_KNOB_H

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The value of environment variable `name`: *value = NULL where it is unset or empty, else the
 * value if it is one of `choices` (NULL-terminated; the choice "#" admits a decimal integer 0 ..
 * 999999999). Any other value fails with KVA_ERR_UNSUPPORTED and a message naming `call`, the
 * variable, its value and the choices. */
kva_status kva__env_knob(const char *call, const char *name, const char *const *choices, const char **value);

#ifdef __cplusplus
}
#endif

#endif
