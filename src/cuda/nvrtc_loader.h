/*
 * nvrtc_loader.h -- NVRTC reached through dlopen on first use, so the library (and the Python
 * extension) load on machines without libnvrtc and only variant creation needs it. Include this
 * instead of calling <nvrtc.h>'s functions directly: the nvrtc* names below are redirected to the
 * loaded table (or to stubs that fail with NVRTC_ERROR_INTERNAL_ERROR when libnvrtc is absent).
 */
#ifndef KVA_CUDA_NVRTC_LOADER_H
#define KVA_CUDA_NVRTC_LOADER_H

#include <nvrtc.h> /* types and constants only */

typedef struct kva__nvrtc_api {
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*GetNumSupportedArchs)(int *);
    nvrtcResult (*GetSupportedArchs)(int *);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                                 const char *const *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetPTX)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*AddNameExpression)(nvrtcProgram, const char *const);
    nvrtcResult (*GetLoweredName)(nvrtcProgram, const char *const, const char **);
} kva__nvrtc_api;

/* The table (loaded once, thread-safe); never NULL. */
const kva__nvrtc_api *kva__nvrtc(void);
/* NULL when libnvrtc was found, else why not (for error messages). */
const char *kva__nvrtc_missing(void);
/* Opens `name` (dlopen's search rules) and resolves every function into *out: 1, or 0 with the
 * reason in why (out untouched). Used by the loader; tests call it with missing or wrong files. */
int kva__nvrtc_open(const char *name, kva__nvrtc_api *out, char *why, size_t why_size);

#define nvrtcGetErrorString (kva__nvrtc()->GetErrorString)
#define nvrtcVersion (kva__nvrtc()->Version)
#define nvrtcGetNumSupportedArchs (kva__nvrtc()->GetNumSupportedArchs)
#define nvrtcGetSupportedArchs (kva__nvrtc()->GetSupportedArchs)
#define nvrtcCreateProgram (kva__nvrtc()->CreateProgram)
#define nvrtcDestroyProgram (kva__nvrtc()->DestroyProgram)
#define nvrtcCompileProgram (kva__nvrtc()->CompileProgram)
#define nvrtcGetPTXSize (kva__nvrtc()->GetPTXSize)
#define nvrtcGetPTX (kva__nvrtc()->GetPTX)
#define nvrtcGetCUBINSize (kva__nvrtc()->GetCUBINSize)
#define nvrtcGetCUBIN (kva__nvrtc()->GetCUBIN)
#define nvrtcGetProgramLogSize (kva__nvrtc()->GetProgramLogSize)
#define nvrtcGetProgramLog (kva__nvrtc()->GetProgramLog)
#define nvrtcAddNameExpression (kva__nvrtc()->AddNameExpression)
#define nvrtcGetLoweredName (kva__nvrtc()->GetLoweredName)

#endif /* KVA_CUDA_NVRTC_LOADER_H */
