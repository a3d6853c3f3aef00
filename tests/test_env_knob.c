/*
 * test_env_knob.c -- kva__env_knob (src/common/env_knob.c), the check a CUDA context applies to
 * its kernel-choice test knobs: unset or empty is "not set", a listed word or (with "#") a decimal
 * number is taken, anything else (case, spaces, a sign, a suffix, too many digits) is refused with
 * KVA_ERR_UNSUPPORTED and a message naming the call, the variable, its value and the choices.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/common/env_knob.h"

#include <string.h>

KVA_TEST(env_knob_takes_listed_values_and_refuses_others) {
    static const char *const paths[] = {"subgroups", "prefill", NULL};
    static const char *const number[] = {"#", NULL};
    static const char *const word_or_number[] = {"off", "#", NULL};
    static const struct {
        const char *const *choices;
        const char *value; /* NULL: unset */
        int ok;            /* 1: taken, 2: taken as "not set", 0: refused */
    } cases[] = {
        {paths, NULL, 2},          {paths, "", 2},           {paths, "prefill", 1},
        {paths, "subgroups", 1},   {paths, "Prefill", 0},    {paths, "prefill ", 0},
        {paths, "sub", 0},         {paths, "0", 0},          {number, "0", 1},
        {number, "7", 1},          {number, "123456789", 1}, {number, "1234567890", 0},
        {number, "-1", 0},         {number, "+3", 0},        {number, "3x", 0},
        {number, " 3", 0},         {number, "three", 0},     {word_or_number, "off", 1},
        {word_or_number, "12", 1}, {word_or_number, "on", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        kva_test_env env;
        kva_test_env_set(&env, "KVA_TEST_KNOB", cases[i].value);
        const char *got = (const char *)&env; /* must be overwritten */
        const kva_status st = kva__env_knob("kva_some_call", "KVA_TEST_KNOB", cases[i].choices, &got);
        const char *shown = cases[i].value ? cases[i].value : "(unset)";
        if (cases[i].ok == 1) {
            CHECK_MSG(st == KVA_OK && got && strcmp(got, cases[i].value) == 0, "'%s': %s, value %s", shown,
                      kva_status_str(st), got ? got : "NULL");
        } else if (cases[i].ok == 2) {
            CHECK_MSG(st == KVA_OK && got == NULL, "'%s': %s, value not NULL", shown, kva_status_str(st));
        } else {
            CHECK_MSG(st == KVA_ERR_UNSUPPORTED && got == NULL, "'%s': %s, expected KVA_ERR_UNSUPPORTED", shown,
                      kva_status_str(st));
            char want[96];
            snprintf(want, sizeof want, "kva_some_call: KVA_TEST_KNOB=%s is not one of: ", cases[i].value);
            CHECK_MSG(strstr(kva_last_error(), want) != NULL, "'%s': message '%s'", shown, kva_last_error());
        }
        kva_test_env_restore(&env);
    }
    /* the message lists the choices */
    kva_test_env env;
    kva_test_env_set(&env, "KVA_TEST_KNOB", "x");
    const char *got;
    CHECK(kva__env_knob("f", "KVA_TEST_KNOB", word_or_number, &got) == KVA_ERR_UNSUPPORTED);
    CHECK_MSG(strcmp(kva_last_error(), "f: KVA_TEST_KNOB=x is not one of: off, a number >= 0") == 0, "message '%s'",
              kva_last_error());
    kva_test_env_restore(&env);
}
