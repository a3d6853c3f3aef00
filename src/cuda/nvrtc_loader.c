/*
 * nvrtc_loader.c -- see nvrtc_loader.h. libnvrtc.so.<the toolkit's major version> first (the
 * ABI the library was built against), then the unversioned name, then the build toolkit's
 * library directory; KVA_NVRTC_LIBRARY names another file instead. Symbols resolved once under
 * pthread_once. Without it every call fails cleanly and kva__nvrtc_missing() says why.
 */
#define _GNU_SOURCE 1
#include "nvrtc_loader.h"

#include <cuda_runtime_api.h> /* CUDART_VERSION */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *stub_error_string(nvrtcResult r) {
    (void)r;
    return "libnvrtc is not available";
}
static nvrtcResult stub_version(int *a, int *b) {
    if (a) *a = 0;
    if (b) *b = 0;
    return NVRTC_ERROR_INTERNAL_ERROR;
}
static nvrtcResult stub_int(int *x) {
    if (x) *x = 0;
    return NVRTC_ERROR_INTERNAL_ERROR;
}
static nvrtcResult stub_create(nvrtcProgram *p, const char *a, const char *b, int n, const char *const *c,
                               const char *const *d) {
    (void)a, (void)b, (void)n, (void)c, (void)d;
    if (p) *p = NULL;
    return NVRTC_ERROR_INTERNAL_ERROR;
}
static nvrtcResult stub_destroy(nvrtcProgram *p) {
    (void)p;
    return NVRTC_ERROR_INTERNAL_ERROR;
}
static nvrtcResult stub_compile(nvrtcProgram p, int n, const char *const *o) {
    (void)p, (void)n, (void)o;
    return NVRTC_ERROR_INTERNAL_ERROR;
}
static nvrtcResult stub_size(nvrtcProgram p, size_t *s) {
    (void)p;
    if (s) *s = 0;
    return NVRTC_ERROR_INTERNAL_ERROR;
}
static nvrtcResult stub_get(nvrtcProgram p, char *s) {
    (void)p, (void)s;
    return NVRTC_ERROR_INTERNAL_ERROR;
}
static nvrtcResult stub_name(nvrtcProgram p, const char *const e) {
    (void)p, (void)e;
    return NVRTC_ERROR_INTERNAL_ERROR;
}
static nvrtcResult stub_lowered(nvrtcProgram p, const char *const e, const char **l) {
    (void)p, (void)e;
    if (l) *l = NULL;
    return NVRTC_ERROR_INTERNAL_ERROR;
}

static kva__nvrtc_api g_api = {stub_error_string, stub_version, stub_int,    stub_int,    stub_create,
                               stub_destroy,      stub_compile, stub_size,   stub_get,    stub_size,
                               stub_get,          stub_size,    stub_get,    stub_name,   stub_lowered};
static char g_missing[1024] = "libnvrtc was not looked for";
static int g_loaded;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

int kva__nvrtc_open(const char *name, kva__nvrtc_api *out, char *why, size_t why_size) {
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, why_size, "%s could not be loaded (%s)", name, e ? e : "?");
        return 0;
    }
    kva__nvrtc_api a;
    int ok = 1;
#define KVA__SYM(field, sym)                                                                       \
    do {                                                                                           \
        void *p = dlsym(h, #sym);                                                                  \
        if (!p) ok = 0;                                                                            \
        memcpy(&a.field, &p, sizeof p);                                                            \
    } while (0)
    KVA__SYM(GetErrorString, nvrtcGetErrorString);
    KVA__SYM(Version, nvrtcVersion);
    KVA__SYM(GetNumSupportedArchs, nvrtcGetNumSupportedArchs);
    KVA__SYM(GetSupportedArchs, nvrtcGetSupportedArchs);
    KVA__SYM(CreateProgram, nvrtcCreateProgram);
    KVA__SYM(DestroyProgram, nvrtcDestroyProgram);
    KVA__SYM(CompileProgram, nvrtcCompileProgram);
    KVA__SYM(GetPTXSize, nvrtcGetPTXSize);
    KVA__SYM(GetPTX, nvrtcGetPTX);
    KVA__SYM(GetCUBINSize, nvrtcGetCUBINSize);
    KVA__SYM(GetCUBIN, nvrtcGetCUBIN);
    KVA__SYM(GetProgramLogSize, nvrtcGetProgramLogSize);
    KVA__SYM(GetProgramLog, nvrtcGetProgramLog);
    KVA__SYM(AddNameExpression, nvrtcAddNameExpression);
    KVA__SYM(GetLoweredName, nvrtcGetLoweredName);
#undef KVA__SYM
    if (!ok) {
        snprintf(why, why_size, "%s lacks an NVRTC function this library needs", name);
        dlclose(h);
        return 0;
    }
    *out = a; /* the handle stays open for the life of the process */
    return 1;
}

static void load(void) {
    const char *forced = getenv("KVA_NVRTC_LIBRARY"); /* a path or name; odd installs */
    if (forced && *forced) {
        g_loaded = kva__nvrtc_open(forced, &g_api, g_missing, sizeof g_missing);
        return;
    }
    char name[64];
    snprintf(name, sizeof name, "libnvrtc.so.%d", CUDART_VERSION / 1000);
    g_loaded = kva__nvrtc_open(name, &g_api, g_missing, sizeof g_missing) ||
               kva__nvrtc_open("libnvrtc.so", &g_api, g_missing, sizeof g_missing);
#ifdef KVA_NVRTC_BUILD_DIR
    /* the toolkit the library was built with, when the loader's path does not hold it */
    if (!g_loaded) {
        char path[512];
        snprintf(path, sizeof path, "%s/libnvrtc.so.%d", KVA_NVRTC_BUILD_DIR, CUDART_VERSION / 1000);
        g_loaded = kva__nvrtc_open(path, &g_api, g_missing, sizeof g_missing);
    }
#endif
}

const kva__nvrtc_api *kva__nvrtc(void) {
    (void)pthread_once(&g_once, load);
    return &g_api;
}

const char *kva__nvrtc_missing(void) {
    (void)pthread_once(&g_once, load);
    return g_loaded ? NULL : g_missing;
}
