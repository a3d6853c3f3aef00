/*
 * _ext.c -- kvattn's CPython binding (module kvattn._ext), written in C against the stable ABI
 * (Py_LIMITED_API 3.9), so one build serves every CPython >= 3.9.
 *
 * Arrays come in through DLPack (__dlpack__ / __dlpack_device__, legacy and versioned capsules):
 * numpy, torch, CuPy and JAX arrays work without kvattn knowing them at build time. torch tensors
 * take a faster path (data_ptr(), shape, stride() read directly; no capsule) when torch is
 * already imported, because a decode run must cost only a few microseconds of host time.
 *
 * Streams: a call on CUDA arrays runs on `stream` when the caller gives one; otherwise on torch's
 * current stream when its first array is a torch tensor, CuPy's current stream when it is a CuPy
 * array; otherwise on the legacy default stream.
 * That stream is handed to the producers' __dlpack__(stream=...) as the protocol asks.
 *
 * Contexts: one kva_context per device (CPU, each CUDA device), created on first use. CPU calls
 * release the GIL and hold the context's mutex (a context serves one thread at a time); CUDA
 * calls only enqueue work, so they keep the GIL, which serialises them.
 *
 * The Python package (kvattn/__init__.py) allocates outputs and holds the documented API; this
 * file checks every shape it is given before it calls the library, so no bad argument reaches C.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <kvattn.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------------------------ */
/* DLPack, as the protocol defines it (our own declarations of the published ABI)               */
/* ------------------------------------------------------------------------------------------ */

enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3, DL_CUDA_MANAGED = 13 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4 };

typedef struct { int32_t device_type, device_id; } dl_device;
typedef struct { uint8_t code, bits; uint16_t lanes; } dl_dtype;
typedef struct {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* NULL: compact row-major (legacy capsules only) */
    uint64_t byte_offset;
} dl_tensor;
typedef struct dl_managed {
    dl_tensor t;
    void *manager_ctx;
    void (*deleter)(struct dl_managed *);
} dl_managed;
typedef struct dl_managed_v {
    uint32_t major, minor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_v *);
    uint64_t flags; /* bit 0: read only */
    dl_tensor t;
} dl_managed_v;

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static PyObject *Error;        /* kvattn.KvattnError(RuntimeError): .status, .status_name, .message */
static PyObject *NoSpaceError; /* KVA_ERR_NO_SPACE: the cache is full; nothing was changed */

static PyObject *raise_status(kva_status st, const char *msg) {
    PyObject *cls = st == KVA_ERR_NO_SPACE ? NoSpaceError : Error;
    PyObject *text = PyUnicode_FromFormat("%s: %s", kva_status_str(st), msg && *msg ? msg : "(no message)");
    if (!text) return NULL;
    PyObject *exc = PyObject_CallFunctionObjArgs(cls, text, NULL);
    Py_DECREF(text);
    if (!exc) return NULL;
    PyObject *code = PyLong_FromLong((long)st);
    PyObject *name = PyUnicode_FromString(kva_status_str(st));
    PyObject *m = PyUnicode_FromString(msg ? msg : "");
    if (code && name && m) {
        PyObject_SetAttrString(exc, "status", code);
        PyObject_SetAttrString(exc, "status_name", name);
        PyObject_SetAttrString(exc, "message", m);
        PyErr_SetObject(cls, exc);
    }
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_XDECREF(m);
    Py_DECREF(exc);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Contexts                                                                                     */
/* ------------------------------------------------------------------------------------------ */

enum { MAX_CUDA_DEVICES = 64 };
typedef struct ctx_slot {
    kva_context *ctx;
    kva_device_type type;
    int device_id;
    pthread_mutex_t mu; /* CPU: held (GIL released) for the duration of each call */
} ctx_slot;

static ctx_slot cpu_slot;
static ctx_slot *cuda_slots[MAX_CUDA_DEVICES];
static int cpu_threads_wanted; /* 0: the library's default (all cores) */

static ctx_slot *get_slot(kva_device_type type, int device_id) {
    ctx_slot *s;
    if (type == KVA_DEVICE_CPU) {
        s = &cpu_slot;
    } else {
        if (device_id < 0 || device_id >= MAX_CUDA_DEVICES) {
            PyErr_Format(PyExc_ValueError, "CUDA device %d out of range", device_id);
            return NULL;
        }
        if (!cuda_slots[device_id]) {
            cuda_slots[device_id] = calloc(1, sizeof(ctx_slot));
            if (!cuda_slots[device_id]) return (ctx_slot *)PyErr_NoMemory();
        }
        s = cuda_slots[device_id];
    }
    if (!s->ctx) {
        kva_status st = kva_context_create(type, device_id, &s->ctx);
        if (st != KVA_OK) return (ctx_slot *)raise_status(st, kva_last_error());
        s->type = type;
        s->device_id = device_id;
        pthread_mutex_init(&s->mu, NULL);
        if (type == KVA_DEVICE_CPU && cpu_threads_wanted > 0)
            kva_context_set_threads(s->ctx, cpu_threads_wanted);
    }
    return s;
}

/* Runs `call` (an expression of type kva_status) on slot `s`, on `stream` for CUDA. CPU: GIL
 * released, context mutex held. The message of a failure is copied while still on this thread. */
#define SLOT_CALL(s, stream, st, call)                                                        \
    do {                                                                                      \
        if ((s)->type == KVA_DEVICE_CPU) {                                                    \
            Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&(s)->mu);                              \
            st = (call);                                                                      \
            pthread_mutex_unlock(&(s)->mu);                                                   \
            Py_END_ALLOW_THREADS                                                              \
        } else {                                                                              \
            kva_context_set_stream((s)->ctx, (stream));                                       \
            st = (call);                                                                      \
        }                                                                                     \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Array import                                                                                 */
/* ------------------------------------------------------------------------------------------ */

enum { MAX_DIMS = 8 };
enum { EL_F32 = 0, EL_F16 = 1, EL_BF16 = 2, EL_I32 = 3, EL_I64 = 4, EL_OTHER = 5 };

typedef struct view {
    char *data;            /* byte offset applied */
    kva_device_type dev;
    int dev_id;
    int el;                /* EL_* */
    int ndim;
    int64_t shape[MAX_DIMS];
    int64_t strides[MAX_DIMS]; /* elements */
    int readonly;
    dl_dtype dl;           /* the DLPack dtype as exported (bits 0: not from DLPack) */
    void *managed;         /* capsule payload to release, or NULL */
    int versioned;
} view;

/* What one call learned about the device and stream from its first CUDA array. */
typedef struct call_state {
    PyObject *stream_arg;  /* the caller's stream= (int or None), borrowed */
    int have_stream;
    void *stream;          /* cudaStream_t */
    int have_dev;
    kva_device_type dev;
    int dev_id;
} call_state;

static PyObject *s_data_ptr, *s_dtype, *s_shape, *s_stride, *s_get_device,
    *s_dlpack, *s_dlpack_device, *s_stream, *s_max_version;
static PyObject *empty_tuple, *max_version_1_0;

/* torch, once the caller has imported it */
static PyObject *torch_tensor_type, *torch_f32, *torch_f16, *torch_bf16, *torch_i32, *torch_i64,
    *torch_raw_stream;
static int torch_checked_import;

static int torch_ready(void) {
    if (torch_tensor_type) return 1;
    PyObject *mods = PyImport_GetModuleDict();
    if (!PyDict_GetItemString(mods, "torch")) return 0;
    if (torch_checked_import) return 0;
    torch_checked_import = 1;
    PyObject *torch = PyImport_ImportModule("torch");
    if (!torch) {
        PyErr_Clear();
        return 0;
    }
    torch_tensor_type = PyObject_GetAttrString(torch, "Tensor");
    torch_f32 = PyObject_GetAttrString(torch, "float32");
    torch_f16 = PyObject_GetAttrString(torch, "float16");
    torch_bf16 = PyObject_GetAttrString(torch, "bfloat16");
    torch_i32 = PyObject_GetAttrString(torch, "int32");
    torch_i64 = PyObject_GetAttrString(torch, "int64");
    PyObject *c = PyObject_GetAttrString(torch, "_C");
    if (c) {
        torch_raw_stream = PyObject_GetAttrString(c, "_cuda_getCurrentRawStream");
        Py_DECREF(c);
    }
    PyErr_Clear();
    Py_DECREF(torch);
    if (!torch_tensor_type || !torch_f32 || !torch_f16 || !torch_bf16 || !torch_i32 || !torch_i64) {
        Py_CLEAR(torch_tensor_type);
        return 0;
    }
    return 1;
}

static int is_torch_tensor(PyObject *o) {
    if (!torch_ready()) return 0;
    return Py_TYPE(o) == (PyTypeObject *)torch_tensor_type ||
           PyType_IsSubtype(Py_TYPE(o), (PyTypeObject *)torch_tensor_type);
}

static void view_release(view *v) {
    if (!v->managed) return;
    if (v->versioned) {
        dl_managed_v *m = v->managed;
        if (m->deleter) m->deleter(m);
    } else {
        dl_managed *m = v->managed;
        if (m->deleter) m->deleter(m);
    }
    v->managed = NULL;
}

static int tuple_to_i64(PyObject *t, int64_t *out, int max, const char *name, const char *what) {
    Py_ssize_t n = PySequence_Size(t);
    if (n < 0) return -1;
    if (n > max) {
        PyErr_Format(PyExc_ValueError, "%s: more than %d dimensions", name, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *x = PySequence_GetItem(t, i);
        if (!x) return -1;
        out[i] = PyLong_AsLongLong(x);
        Py_DECREF(x);
        if (out[i] == -1 && PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "%s: bad %s", name, what);
            return -1;
        }
    }
    return (int)n;
}

/* CuPy's current stream (cupy.cuda.get_current_stream().ptr), for CuPy arrays. */
static PyObject *cupy_get_stream, *s_cupy;

static int cupy_stream(PyObject *o, void **out) {
    PyObject *mod = PyObject_GetAttrString((PyObject *)Py_TYPE(o), "__module__");
    if (!mod) {
        PyErr_Clear();
        return 0;
    }
    int is_cupy = PyUnicode_Check(mod) && PyUnicode_Tailmatch(mod, s_cupy, 0, 4, -1) == 1;
    Py_DECREF(mod);
    if (!is_cupy) return 0;
    if (!cupy_get_stream) {
        PyObject *cuda = PyImport_ImportModule("cupy.cuda");
        if (!cuda) return -1;
        cupy_get_stream = PyObject_GetAttrString(cuda, "get_current_stream");
        Py_DECREF(cuda);
        if (!cupy_get_stream) return -1;
    }
    PyObject *st = PyObject_CallObject(cupy_get_stream, NULL);
    if (!st) return -1;
    PyObject *ptr = PyObject_GetAttrString(st, "ptr");
    Py_DECREF(st);
    if (!ptr) return -1;
    *out = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    return PyErr_Occurred() ? -1 : 1;
}

/* Sets cs's stream the first time a CUDA array is met. `first` is that array (NULL: none). */
static int decide_stream_of(call_state *cs, int torch_first, int dev_id, PyObject *first) {
    if (cs->have_stream) return 0;
    int rc;
    if (cs->stream_arg && cs->stream_arg != Py_None) {
        cs->stream = PyLong_AsVoidPtr(cs->stream_arg);
        if (PyErr_Occurred()) return -1;
    } else if (!torch_first && first && (rc = cupy_stream(first, &cs->stream)) != 0) {
        if (rc < 0) return -1;
    } else if (torch_first && torch_raw_stream) {
        PyObject *r = PyObject_CallFunction(torch_raw_stream, "i", dev_id);
        if (!r) return -1;
        cs->stream = PyLong_AsVoidPtr(r);
        Py_DECREF(r);
        if (PyErr_Occurred()) return -1;
    } else {
        cs->stream = NULL; /* legacy default stream */
    }
    cs->have_stream = 1;
    return 0;
}

static int decide_stream(call_state *cs, int torch_first, int dev_id) {
    return decide_stream_of(cs, torch_first, dev_id, NULL);
}

/* The stream for a call that takes no arrays (plans, cache bookkeeping) on slot s: stream= if
 * given, else torch's current stream of that device once torch is imported, else the legacy
 * default stream. Plans upload on it, so a run on the same stream sees the plan. */
static int slot_stream(const ctx_slot *s, PyObject *stream_arg, void **out) {
    *out = NULL;
    if (s->type != KVA_DEVICE_CUDA) return 0;
    call_state cs = {.stream_arg = stream_arg};
    if (decide_stream(&cs, torch_ready(), s->device_id) < 0) return -1;
    *out = cs.stream;
    return 0;
}

static int torch_view(PyObject *o, view *v, call_state *cs, const char *name) {
    /* get_device(): the CUDA ordinal, or -1 for host tensors (one call instead of .device) */
    PyObject *r = PyObject_CallMethodObjArgs(o, s_get_device, NULL);
    if (!r) return -1;
    long dev = PyLong_AsLong(r);
    Py_DECREF(r);
    if (dev == -1 && PyErr_Occurred()) return -1;
    if (dev >= 0) {
        v->dev = KVA_DEVICE_CUDA;
        v->dev_id = (int)dev;
        if (decide_stream(cs, 1, v->dev_id) < 0) return -1;
    } else {
        v->dev = KVA_DEVICE_CPU;
        v->dev_id = 0;
    }
    PyObject *dt = PyObject_GetAttr(o, s_dtype);
    if (!dt) return -1;
    v->el = dt == torch_f32 ? EL_F32 : dt == torch_f16 ? EL_F16 : dt == torch_bf16 ? EL_BF16
          : dt == torch_i32 ? EL_I32 : dt == torch_i64 ? EL_I64 : EL_OTHER;
    Py_DECREF(dt);
    r = PyObject_GetAttr(o, s_shape);
    if (!r) return -1;
    v->ndim = tuple_to_i64(r, v->shape, MAX_DIMS, name, "shape");
    Py_DECREF(r);
    if (v->ndim < 0) return -1;
    r = PyObject_CallMethodObjArgs(o, s_stride, NULL);
    if (!r) return -1;
    int n = tuple_to_i64(r, v->strides, MAX_DIMS, name, "strides");
    Py_DECREF(r);
    if (n < 0) return -1;
    r = PyObject_CallMethodObjArgs(o, s_data_ptr, NULL);
    if (!r) return -1;
    v->data = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    if (PyErr_Occurred()) return -1;
    if (!v->data && v->dev == KVA_DEVICE_CPU) {
        int64_t n = 1;
        for (int i = 0; i < v->ndim; ++i) n *= v->shape[i];
        if (n > 0) {
            PyErr_Format(PyExc_ValueError, "%s: torch tensor without CPU or CUDA storage", name);
            return -1;
        }
    }
    return 0;
}

static int el_from_dl(dl_dtype d) {
    if (d.lanes != 1) return EL_OTHER;
    if (d.code == DL_FLOAT && d.bits == 32) return EL_F32;
    if (d.code == DL_FLOAT && d.bits == 16) return EL_F16;
    if (d.code == DL_BFLOAT && d.bits == 16) return EL_BF16;
    if (d.code == DL_INT && d.bits == 32) return EL_I32;
    if (d.code == DL_INT && d.bits == 64) return EL_I64;
    return EL_OTHER;
}

static int el_size(int el) { return el == EL_F32 || el == EL_I32 ? 4 : el == EL_I64 ? 8 : 2; }

/* Producers that refused max_version= (pre-1.0 DLPack): remembered per type. */
static PyObject *legacy_types; /* set of types */

static int dlpack_view(PyObject *o, view *v, call_state *cs, const char *name) {
    PyObject *dev = PyObject_CallMethodObjArgs(o, s_dlpack_device, NULL);
    if (!dev) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "%s: expected an array supporting DLPack (numpy, torch, CuPy, JAX, ...)", name);
        }
        return -1;
    }
    int dev_type = -1, dev_id = 0;
    if (!PyArg_ParseTuple(dev, "ii", &dev_type, &dev_id)) {
        Py_DECREF(dev);
        return -1;
    }
    Py_DECREF(dev);
    PyObject *kw = PyDict_New();
    if (!kw) return -1;
    if (dev_type == DL_CUDA || dev_type == DL_CUDA_MANAGED) {
        if (decide_stream_of(cs, 0, dev_id, o) < 0) {
            Py_DECREF(kw);
            return -1;
        }
        /* DLPack: 1 names the legacy default stream; 0 is disallowed for CUDA */
        PyObject *s = PyLong_FromVoidPtr(cs->stream ? cs->stream : (void *)1);
        if (!s || PyDict_SetItem(kw, s_stream, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(kw);
            return -1;
        }
        Py_DECREF(s);
        v->dev = KVA_DEVICE_CUDA;
        v->dev_id = dev_id;
    } else if (dev_type == DL_CPU || dev_type == DL_CUDA_HOST) {
        v->dev = KVA_DEVICE_CPU;
        v->dev_id = 0;
    } else {
        Py_DECREF(kw);
        PyErr_Format(PyExc_ValueError, "%s: DLPack device type %d is not supported (CPU or CUDA)", name,
                     dev_type);
        return -1;
    }
    int try_versioned = PySet_Contains(legacy_types, (PyObject *)Py_TYPE(o)) == 0;
    PyObject *meth = PyObject_GetAttr(o, s_dlpack);
    if (!meth) {
        Py_DECREF(kw);
        return -1;
    }
    PyObject *cap = NULL;
    if (try_versioned) {
        PyDict_SetItem(kw, s_max_version, max_version_1_0);
        cap = PyObject_Call(meth, empty_tuple, kw);
        if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PySet_Add(legacy_types, (PyObject *)Py_TYPE(o));
            PyDict_DelItem(kw, s_max_version);
        } else if (!cap) {
            Py_DECREF(meth);
            Py_DECREF(kw);
            return -1;
        }
    }
    if (!cap) cap = PyObject_Call(meth, empty_tuple, kw);
    Py_DECREF(meth);
    Py_DECREF(kw);
    if (!cap) return -1;
    dl_tensor *t;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        dl_managed_v *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        PyCapsule_SetName(cap, "used_dltensor_versioned");
        v->managed = m;
        v->versioned = 1;
        v->readonly = (int)(m->flags & 1);
        t = &m->t;
        if (m->major != 1) {
            Py_DECREF(cap);
            view_release(v);
            PyErr_Format(PyExc_ValueError, "%s: DLPack version %u is not supported", name, m->major);
            return -1;
        }
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
        PyCapsule_SetName(cap, "used_dltensor");
        v->managed = m;
        v->versioned = 0;
        t = &m->t;
    } else {
        Py_DECREF(cap);
        PyErr_Format(PyExc_TypeError, "%s: __dlpack__ returned no DLPack capsule", name);
        return -1;
    }
    Py_DECREF(cap);
    if (t->ndim > MAX_DIMS) {
        view_release(v);
        PyErr_Format(PyExc_ValueError, "%s: more than %d dimensions", name, MAX_DIMS);
        return -1;
    }
    v->ndim = t->ndim;
    v->el = el_from_dl(t->dtype);
    v->dl = t->dtype;
    v->data = (char *)t->data + t->byte_offset;
    int64_t run = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
        v->shape[i] = t->shape[i];
        v->strides[i] = t->strides ? t->strides[i] : run;
        run *= t->shape[i];
    }
    return 0;
}

/* Reads obj as an array; all arrays of a call must be on one device. */
static int view_get(PyObject *o, view *v, call_state *cs, const char *name) {
    memset(v, 0, sizeof *v);
    int rc = is_torch_tensor(o) ? torch_view(o, v, cs, name) : dlpack_view(o, v, cs, name);
    if (rc < 0) return -1;
    /* An array without elements has no meaningful strides (numpy exports them as 0): give it
     * compact row-major ones, so that an empty batch passes the contiguity checks. */
    int empty = 0;
    for (int i = 0; i < v->ndim; ++i) empty |= v->shape[i] == 0;
    if (empty) {
        int64_t run = 1;
        for (int i = v->ndim - 1; i >= 0; --i) {
            v->strides[i] = run;
            run *= v->shape[i];
        }
    }
    if (!cs->have_dev) {
        cs->have_dev = 1;
        cs->dev = v->dev;
        cs->dev_id = v->dev_id;
    } else if (cs->dev != v->dev || cs->dev_id != v->dev_id) {
        view_release(v);
        PyErr_Format(PyExc_ValueError, "%s is on another device than the call's first array", name);
        return -1;
    }
    return 0;
}

static const char *el_name(int el) {
    static const char *n[] = {"float32", "float16", "bfloat16", "int32", "int64", "other"};
    return n[el];
}

/* The view's dtype for a message: el_name, or for one kvattn does not take its DLPack name
 * (float64, uint8, complex64, bool, ...) when it came through DLPack. */
static const char *view_dtype_name(const view *v, char buf[32]) {
    static const char *kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
    if (v->el != EL_OTHER || v->dl.bits == 0) return el_name(v->el);
    if (v->dl.code == 6) return "bool";
    if (v->dl.code < sizeof kinds / sizeof kinds[0])
        snprintf(buf, 32, "%s%d%s", kinds[v->dl.code], (int)v->dl.bits, v->dl.lanes > 1 ? " vector" : "");
    else
        snprintf(buf, 32, "DLPack code %d, %d bits", (int)v->dl.code, (int)v->dl.bits);
    return buf;
}

static kva_dtype el_kva(int el) { return el == EL_F16 ? KVA_F16 : el == EL_BF16 ? KVA_BF16 : KVA_F32; }

/* A float array [tokens, heads, dim] with a contiguous last dimension. */
static int as_kva_tensor(const view *v, const char *name, int64_t tokens, int64_t heads, int64_t dim,
                         int el, kva_tensor *out) {
    if (v->ndim != 3) {
        PyErr_Format(PyExc_ValueError, "%s: expected 3 dimensions [tokens, heads, head_dim], got %d", name,
                     v->ndim);
        return -1;
    }
    if ((tokens >= 0 && v->shape[0] != tokens) || (heads >= 0 && v->shape[1] != heads) ||
        (dim >= 0 && v->shape[2] != dim)) {
        PyErr_Format(PyExc_ValueError, "%s: shape (%lld, %lld, %lld), expected (%lld, %lld, %lld) (-1: any)",
                     name, (long long)v->shape[0], (long long)v->shape[1], (long long)v->shape[2],
                     (long long)tokens, (long long)heads, (long long)dim);
        return -1;
    }
    if (v->el != el) {
        char buf[32];
        PyErr_Format(PyExc_TypeError, "%s: dtype %s, expected %s", name, view_dtype_name(v, buf), el_name(el));
        return -1;
    }
    if (v->shape[2] > 1 && v->strides[2] != 1) {
        PyErr_Format(PyExc_ValueError, "%s: the last dimension must be contiguous", name);
        return -1;
    }
    out->data = v->data;
    out->dtype = el_kva(el);
    out->stride_token = v->shape[0] > 1 ? v->strides[0] : v->shape[1] * v->shape[2];
    out->stride_head = v->shape[1] > 1 ? v->strides[1] : v->shape[2];
    return 0;
}

static int check_float(const view *v, const char *name) {
    if (v->el > EL_BF16) {
        char buf[32];
        PyErr_Format(PyExc_TypeError, "%s: dtype %s; kvattn computes on float32, float16 or bfloat16",
                     name, view_dtype_name(v, buf));
        return -1;
    }
    return 0;
}

/* A contiguous f32 array [rows, cols] (LSE); NULL for None. On failure nothing is held.
 * `writes`: the call writes it (an output), so a read-only array is refused. */
/* A float32 [rows, cols] array (or None): 1 with *v held (release it; its data may be NULL when
 * it has no elements), 0 for None, -1 with an exception set and nothing held. */
static int f32_out(PyObject *o, view *v, call_state *cs, const char *name, int64_t rows, int64_t cols,
                   int writes, float **out) {
    *out = NULL;
    if (o == Py_None || !o) return 0;
    if (view_get(o, v, cs, name) < 0) return -1;
    int ok = v->el == EL_F32 && v->ndim == 2 && v->shape[0] == rows && v->shape[1] == cols &&
             (cols <= 1 || v->strides[1] == 1) && (rows <= 1 || v->strides[0] == cols);
    if (!ok) {
        view_release(v);
        PyErr_Format(PyExc_ValueError, "%s: expected a contiguous float32 array of shape (%lld, %lld)",
                     name, (long long)rows, (long long)cols);
        return -1;
    }
    if (writes && v->readonly) {
        view_release(v);
        PyErr_Format(PyExc_ValueError, "%s: read-only array", name);
        return -1;
    }
    *out = (float *)v->data;
    return 1;
}

/* ---- host int32 arrays (page tables, indptr): a CPU int32/int64 array or a sequence of ints ---- */

typedef struct i32arr {
    int32_t *p;
    Py_ssize_t n;
    int32_t *owned;
} i32arr;

static void i32_free(i32arr *a) {
    free(a->owned);
    a->owned = NULL;
}

static int i32_get(PyObject *o, i32arr *a, const char *name) {
    memset(a, 0, sizeof *a);
    int arraylike = is_torch_tensor(o) || PyObject_HasAttr(o, s_dlpack);
    if (arraylike) {
        call_state cs = {0};
        view v;
        if (view_get(o, &v, &cs, name) < 0) return -1;
        if (v.dev != KVA_DEVICE_CPU || v.ndim != 1 || (v.el != EL_I32 && v.el != EL_I64)) {
            view_release(&v);
            PyErr_Format(PyExc_ValueError, "%s: expected a 1-D int32/int64 array in host memory", name);
            return -1;
        }
        a->n = (Py_ssize_t)v.shape[0];
        if (v.el == EL_I32 && (a->n <= 1 || v.strides[0] == 1)) {
            a->p = (int32_t *)v.data; /* the caller's array stays alive during the call */
            view_release(&v);
            return 0;
        }
        a->owned = malloc(sizeof(int32_t) * (size_t)(a->n ? a->n : 1));
        if (!a->owned) {
            view_release(&v);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < a->n; ++i) {
            int64_t x = v.el == EL_I32 ? ((int32_t *)v.data)[i * v.strides[0]]
                                       : ((int64_t *)v.data)[i * v.strides[0]];
            if (x < INT32_MIN || x > INT32_MAX) {
                view_release(&v);
                i32_free(a);
                PyErr_Format(PyExc_OverflowError, "%s[%zd] does not fit int32", name, i);
                return -1;
            }
            a->owned[i] = (int32_t)x;
        }
        view_release(&v);
        a->p = a->owned;
        return 0;
    }
    PyObject *seq = PySequence_Fast(o, "");
    if (!seq) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a sequence of ints or a host int array", name);
        return -1;
    }
    a->n = PySequence_Size(seq);
    a->owned = malloc(sizeof(int32_t) * (size_t)(a->n ? a->n : 1));
    if (!a->owned) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < a->n; ++i) {
        PyObject *x = PySequence_GetItem(seq, i);
        long long val = x ? PyLong_AsLongLong(x) : -1;
        Py_XDECREF(x);
        if ((val == -1 && PyErr_Occurred()) || val < INT32_MIN || val > INT32_MAX) {
            Py_DECREF(seq);
            i32_free(a);
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s[%zd]: expected an int32", name, i);
            return -1;
        }
        a->owned[i] = (int32_t)val;
    }
    Py_DECREF(seq);
    a->p = a->owned;
    return 0;
}

static PyObject *list_i32(const int32_t *p, Py_ssize_t n) {
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *x = PyLong_FromLong(p[i]);
        if (!x) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SetItem(l, i, x);
    }
    return l;
}

/* A Python int that must fit int32 (a sequence id, layer or page): OverflowError otherwise,
 * rather than a cast that would name another sequence (2**32 + 1 is not sequence 1). */
static int arg_i32(PyObject *arg, const char *name, int32_t *out) {
    long long x = PyLong_AsLongLong(arg);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < INT32_MIN || x > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s = %lld does not fit int32", name, x);
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

static int parse_device(PyObject *args_dev_type, int dev_id, kva_device_type *out) {
    (void)dev_id;
    long t = PyLong_AsLong(args_dev_type);
    if (t == -1 && PyErr_Occurred()) return -1;
    if (t != KVA_DEVICE_CPU && t != KVA_DEVICE_CUDA) {
        PyErr_SetString(PyExc_ValueError, "device type must be 0 (CPU) or 1 (CUDA)");
        return -1;
    }
    *out = (kva_device_type)t;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* KVPages: one layer's page pool, read once and reused by every run                            */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    kva_kv_pages pages;
    kva_device_type dev;
    int dev_id;
    PyObject *keep; /* the arrays (or cache) the pages live in */
} KVPagesObject;

static PyTypeObject *KVPagesType;

static void generic_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static void kvpages_dealloc(PyObject *self) {
    Py_CLEAR(((KVPagesObject *)self)->keep);
    generic_dealloc(self);
}

static PyObject *alloc_instance(PyTypeObject *tp) {
    allocfunc a = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    return a(tp, 0);
}

/* Page pool geometry from arrays: either k and v [num_pages, page_size, kv_heads, dim] (NHD) or
 * [num_pages, kv_heads, page_size, dim] (HND), or one interleaved array k [num_pages, 2, ...]
 * with v None. */
static int pages_from_arrays(PyObject *k, PyObject *v, int hnd, call_state *cs, kva_kv_pages *out) {
    view a, b;
    if (view_get(k, &a, cs, v == Py_None ? "paged_kv" : "k_pages") < 0) return -1;
    int rc = -1;
    int inter = v == Py_None;
    int base = inter ? 1 : 0;
    if (check_float(&a, "k_pages") < 0) goto done_a;
    if (a.ndim != 4 + base || (inter && a.shape[1] != 2)) {
        PyErr_SetString(PyExc_ValueError,
                        inter ? "paged_kv: expected [num_pages, 2, page_size, kv_heads, head_dim] (NHD) or "
                                "[num_pages, 2, kv_heads, page_size, head_dim] (HND)"
                              : "k_pages: expected [num_pages, page_size, kv_heads, head_dim] (NHD) or "
                                "[num_pages, kv_heads, page_size, head_dim] (HND)");
        goto done_a;
    }
    if (a.shape[3 + base] > 1 && a.strides[3 + base] != 1) {
        PyErr_SetString(PyExc_ValueError, "paged K/V: the last dimension must be contiguous");
        goto done_a;
    }
    memset(out, 0, sizeof *out);
    out->dtype = el_kva(a.el);
    out->num_pages = (int32_t)a.shape[0];
    out->page_size = (int32_t)a.shape[hnd ? 2 + base : 1 + base];
    out->num_kv_heads = (int32_t)a.shape[hnd ? 1 + base : 2 + base];
    out->head_dim = (int32_t)a.shape[3 + base];
    out->stride_page = a.strides[0];
    out->stride_token = a.strides[hnd ? 2 + base : 1 + base];
    out->stride_head = a.strides[hnd ? 1 + base : 2 + base];
    out->k_data = a.data;
    if (inter) {
        out->v_data = a.data + a.strides[1] * el_size(a.el);
        rc = 0;
        goto done_a;
    }
    if (view_get(v, &b, cs, "v_pages") < 0) goto done_a;
    int same = b.ndim == a.ndim && b.el == a.el;
    for (int i = 0; same && i < a.ndim; ++i) same = b.shape[i] == a.shape[i] && b.strides[i] == a.strides[i];
    if (!same) {
        PyErr_SetString(PyExc_ValueError, "v_pages: must match k_pages in shape, strides and dtype");
    } else {
        out->v_data = b.data;
        rc = 0;
    }
    view_release(&b);
done_a:
    view_release(&a);
    return rc;
}

static PyObject *kvpages_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kws[] = {"k", "v", "hnd", NULL};
    PyObject *k, *v = Py_None;
    int hnd = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Op", kws, &k, &v, &hnd)) return NULL;
    call_state cs = {0};
    kva_kv_pages pages;
    if (pages_from_arrays(k, v, hnd, &cs, &pages) < 0) return NULL;
    KVPagesObject *self = (KVPagesObject *)alloc_instance(tp);
    if (!self) return NULL;
    self->pages = pages;
    self->dev = cs.dev;
    self->dev_id = cs.dev_id;
    self->keep = Py_BuildValue("(OO)", k, v);
    return (PyObject *)self;
}

static PyObject *kvpages_geometry(PyObject *o, void *c) {
    (void)c;
    KVPagesObject *s = (KVPagesObject *)o;
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:L,s:L,s:L,s:s}", "num_pages", s->pages.num_pages,
                         "page_size", s->pages.page_size, "num_kv_heads", s->pages.num_kv_heads,
                         "head_dim", s->pages.head_dim, "dtype", (int)s->pages.dtype, "stride_page",
                         (long long)s->pages.stride_page, "stride_token", (long long)s->pages.stride_token,
                         "stride_head", (long long)s->pages.stride_head, "device",
                         s->dev == KVA_DEVICE_CPU ? "cpu" : "cuda");
}

static PyGetSetDef kvpages_getset[] = {
    {"geometry", kvpages_geometry, NULL, "dict: pool geometry (pages, page size, heads, strides)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot kvpages_slots[] = {
    {Py_tp_new, kvpages_new},
    {Py_tp_dealloc, kvpages_dealloc},
    {Py_tp_getset, kvpages_getset},
    {Py_tp_doc, "KVPages(k, v=None, hnd=False): one layer's paged K/V pool, read once.\n"
                "k, v: [num_pages, page_size, kv_heads, head_dim] (NHD; HND with hnd=True: "
                "[num_pages, kv_heads, page_size, head_dim]); or k alone, interleaved "
                "[num_pages, 2, ...]."},
    {0, NULL}};
static PyType_Spec kvpages_spec = {"kvattn._ext.KVPages", sizeof(KVPagesObject), 0, Py_TPFLAGS_DEFAULT,
                                   kvpages_slots};

/* Pages for a run: a KVPages object (fast), a (k, v) tuple, or an interleaved array. */
static int get_pages(PyObject *o, int hnd, call_state *cs, kva_kv_pages *out) {
    if (Py_TYPE(o) == KVPagesType) {
        KVPagesObject *p = (KVPagesObject *)o;
        if (!cs->have_dev) {
            cs->have_dev = 1;
            cs->dev = p->dev;
            cs->dev_id = p->dev_id;
        } else if (cs->dev != p->dev || cs->dev_id != p->dev_id) {
            PyErr_SetString(PyExc_ValueError, "paged K/V is on another device than q");
            return -1;
        }
        *out = p->pages;
        return 0;
    }
    if (PyTuple_Check(o) || PyList_Check(o)) {
        if (PySequence_Size(o) != 2) {
            PyErr_SetString(PyExc_ValueError, "paged K/V: expected (k_pages, v_pages)");
            return -1;
        }
        PyObject *k = PySequence_GetItem(o, 0), *v = PySequence_GetItem(o, 1);
        int rc = k && v ? pages_from_arrays(k, v, hnd, cs, out) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        return rc;
    }
    return pages_from_arrays(o, Py_None, hnd, cs, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Cache                                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    kva_cache *cache;
    ctx_slot *slot;
    kva_cache_config cfg;
    int32_t *scratch; /* page-table arrays: [max_sequences + 1] + [max_sequences] + [scratch_pages] */
    int64_t scratch_pages;
} CacheObject;

static PyTypeObject *CacheType;

static void cache_dealloc(PyObject *o) {
    CacheObject *c = (CacheObject *)o;
    kva_cache_destroy(c->cache);
    free(c->scratch);
    generic_dealloc(o);
}

static PyObject *cache_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kws[] = {"device_type", "device_id", "num_layers", "num_kv_heads", "head_dim",
                          "page_size", "num_pages", "dtype", "layout", "max_sequences",
                          "max_append_tokens", NULL};
    PyObject *dt;
    int dev_id;
    kva_cache_config c = {0};
    int dtype, layout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oiiiiiiiiii", kws, &dt, &dev_id, &c.num_layers,
                                     &c.num_kv_heads, &c.head_dim, &c.page_size, &c.num_pages, &dtype,
                                     &layout, &c.max_sequences, &c.max_append_tokens))
        return NULL;
    kva_device_type dev;
    if (parse_device(dt, dev_id, &dev) < 0) return NULL;
    c.dtype = (kva_dtype)dtype;
    c.layout = (kva_layout)layout;
    ctx_slot *s = get_slot(dev, dev_id);
    if (!s) return NULL;
    CacheObject *self = (CacheObject *)alloc_instance(tp);
    if (!self) return NULL;
    self->slot = s;
    self->cfg = c;
    kva_status st;
    SLOT_CALL(s, NULL, st, kva_cache_create(s->ctx, &c, &self->cache));
    if (st != KVA_OK) {
        Py_DECREF(self);
        return raise_status(st, kva_last_error());
    }
    size_t n = (size_t)c.max_sequences * 2 + 1 + (size_t)c.num_pages;
    self->scratch = malloc(n * sizeof(int32_t));
    self->scratch_pages = c.num_pages;
    if (!self->scratch) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

#define CACHE_CALL(c, st, call)                                                                  \
    do {                                                                                          \
        void *cstream_ = NULL;                                                                    \
        if (slot_stream((c)->slot, Py_None, &cstream_) < 0) return NULL;                          \
        SLOT_CALL((c)->slot, cstream_, st, call);                                                 \
    } while (0)

static PyObject *cache_add(PyObject *o, PyObject *unused) {
    (void)unused;
    CacheObject *c = (CacheObject *)o;
    int32_t id;
    kva_status st;
    CACHE_CALL(c, st, kva_cache_add_sequence(c->cache, &id));
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    return PyLong_FromLong(id);
}

static PyObject *cache_free_seq(PyObject *o, PyObject *arg) {
    CacheObject *c = (CacheObject *)o;
    int32_t id;
    if (arg_i32(arg, "seq_id", &id) < 0) return NULL;
    kva_status st;
    CACHE_CALL(c, st, kva_cache_free_sequence(c->cache, id));
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    Py_RETURN_NONE;
}

static PyObject *cache_fork(PyObject *o, PyObject *arg) {
    CacheObject *c = (CacheObject *)o;
    int32_t id;
    if (arg_i32(arg, "seq_id", &id) < 0) return NULL;
    int32_t child;
    kva_status st;
    CACHE_CALL(c, st, kva_cache_fork(c->cache, id, &child));
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    return PyLong_FromLong(child);
}

static int ids_and_counts(PyObject *ids_o, PyObject *cnt_o, i32arr *ids, i32arr *cnt) {
    if (i32_get(ids_o, ids, "seq_ids") < 0) return -1;
    if (i32_get(cnt_o, cnt, "num_new") < 0) {
        i32_free(ids);
        return -1;
    }
    if (ids->n != cnt->n) {
        i32_free(ids);
        i32_free(cnt);
        PyErr_SetString(PyExc_ValueError, "seq_ids and num_new differ in length");
        return -1;
    }
    return 0;
}

static PyObject *cache_reserve(PyObject *o, PyObject *args) {
    CacheObject *c = (CacheObject *)o;
    PyObject *ids_o, *cnt_o;
    if (!PyArg_ParseTuple(args, "OO", &ids_o, &cnt_o)) return NULL;
    i32arr ids, cnt;
    if (ids_and_counts(ids_o, cnt_o, &ids, &cnt) < 0) return NULL;
    kva_status st;
    CACHE_CALL(c, st, kva_cache_reserve(c->cache, (int32_t)ids.n, ids.p, cnt.p));
    i32_free(&ids);
    i32_free(&cnt);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    Py_RETURN_NONE;
}

static PyObject *cache_append(PyObject *o, PyObject *args, PyObject *kw) {
    static char *kws[] = {"layer", "seq_ids", "num_new", "k", "v", "stream", NULL};
    CacheObject *c = (CacheObject *)o;
    int layer;
    PyObject *ids_o, *cnt_o, *k_o, *v_o, *stream = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iOOOO|O", kws, &layer, &ids_o, &cnt_o, &k_o, &v_o, &stream))
        return NULL;
    i32arr ids, cnt;
    if (ids_and_counts(ids_o, cnt_o, &ids, &cnt) < 0) return NULL;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < cnt.n; ++i) total += cnt.p[i];
    call_state cs = {.stream_arg = stream};
    view kv, vv;
    PyObject *res = NULL;
    if (view_get(k_o, &kv, &cs, "k") < 0) goto out0;
    if (view_get(v_o, &vv, &cs, "v") < 0) goto out1;
    kva_tensor kt, vt;
    int el = c->cfg.dtype == KVA_F16 ? EL_F16 : c->cfg.dtype == KVA_BF16 ? EL_BF16 : EL_F32;
    if (cs.dev != c->slot->type || cs.dev_id != (c->slot->type == KVA_DEVICE_CPU ? 0 : c->slot->device_id)) {
        PyErr_SetString(PyExc_ValueError, "k, v: not on the cache's device");
        goto out2;
    }
    if (as_kva_tensor(&kv, "k", total, c->cfg.num_kv_heads, c->cfg.head_dim, el, &kt) < 0 ||
        as_kva_tensor(&vv, "v", total, c->cfg.num_kv_heads, c->cfg.head_dim, el, &vt) < 0)
        goto out2;
    kva_status st;
    SLOT_CALL(c->slot, cs.stream, st, kva_cache_append(c->cache, layer, (int32_t)ids.n, ids.p, cnt.p, kt, vt));
    if (st != KVA_OK) {
        raise_status(st, kva_last_error());
        goto out2;
    }
    res = Py_None;
    Py_INCREF(res);
out2:
    view_release(&vv);
out1:
    view_release(&kv);
out0:
    i32_free(&ids);
    i32_free(&cnt);
    return res;
}

static PyObject *cache_seq_len(PyObject *o, PyObject *arg) {
    CacheObject *c = (CacheObject *)o;
    int32_t id;
    if (arg_i32(arg, "seq_id", &id) < 0) return NULL;
    int32_t len;
    kva_status st = kva_cache_seq_len(c->cache, id, &len);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    return PyLong_FromLong(len);
}

/* The page table of seq_ids into the cache's scratch arrays. */
static int cache_table(CacheObject *c, PyObject *ids_o, kva_page_table *t, i32arr *ids) {
    if (i32_get(ids_o, ids, "seq_ids") < 0) return -1;
    if (ids->n > c->cfg.max_sequences) {
        i32_free(ids);
        PyErr_SetString(PyExc_ValueError, "seq_ids: more ids than the cache's max_sequences");
        return -1;
    }
    int32_t n = (int32_t)ids->n;
    /* forked sequences share pages, so a table can name more pages than the pool holds */
    int64_t need = 0;
    for (int32_t i = 0; i < n; ++i) {
        int32_t len = 0;
        if (kva_cache_seq_len(c->cache, ids->p[i], &len) == KVA_OK) need += (len + c->cfg.page_size - 1) / c->cfg.page_size;
    }
    if (need > INT32_MAX) need = INT32_MAX;
    if (need > c->scratch_pages) {
        int32_t *p = realloc(c->scratch, sizeof(int32_t) * ((size_t)c->cfg.max_sequences * 2 + 1 + (size_t)need));
        if (!p) {
            i32_free(ids);
            PyErr_NoMemory();
            return -1;
        }
        c->scratch = p;
        c->scratch_pages = need;
    }
    int32_t *indptr = c->scratch, *last = c->scratch + n + 1, *indices = last + n;
    kva_status st = kva_cache_page_table(c->cache, n, ids->p, indptr, indices, (int32_t)c->scratch_pages, last, t);
    if (st != KVA_OK) {
        i32_free(ids);
        raise_status(st, kva_last_error());
        return -1;
    }
    return 0;
}

static PyObject *cache_page_table(PyObject *o, PyObject *ids_o) {
    CacheObject *c = (CacheObject *)o;
    kva_page_table t;
    i32arr ids;
    if (cache_table(c, ids_o, &t, &ids) < 0) return NULL;
    int32_t n = t.batch_size;
    PyObject *r = Py_BuildValue("(NNN)", list_i32(t.indptr, n + 1), list_i32(t.indices, t.indptr[n]),
                                list_i32(t.last_page_len, n));
    i32_free(&ids);
    return r;
}

static PyObject *cache_stats(PyObject *o, PyObject *unused) {
    (void)unused;
    CacheObject *c = (CacheObject *)o;
    kva_cache_stats s;
    kva_status st = kva_cache_get_stats(c->cache, &s);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:L,s:L}", "num_pages", s.num_pages, "free_pages",
                         s.free_pages, "used_pages", s.used_pages, "shared_pages", s.shared_pages,
                         "peak_used_pages", s.peak_used_pages, "num_sequences", s.num_sequences,
                         "num_tokens", (long long)s.num_tokens, "cow_copies", (long long)s.cow_copies);
}

static PyObject *cache_prefault(PyObject *o, PyObject *unused) {
    (void)unused;
    CacheObject *c = (CacheObject *)o;
    kva_status st = kva_cache_prefault(c->cache);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    Py_RETURN_NONE;
}

static PyObject *cache_refcount(PyObject *o, PyObject *arg) {
    CacheObject *c = (CacheObject *)o;
    int32_t p;
    if (arg_i32(arg, "page", &p) < 0) return NULL;
    int32_t rc;
    kva_status st = kva_cache_page_refcount(c->cache, p, &rc);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    return PyLong_FromLong(rc);
}

static PyObject *cache_layer_pages(PyObject *o, PyObject *arg) {
    CacheObject *c = (CacheObject *)o;
    int32_t layer;
    if (arg_i32(arg, "layer", &layer) < 0) return NULL;
    kva_kv_pages pages;
    kva_status st = kva_cache_layer_pages(c->cache, layer, &pages);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    KVPagesObject *p = (KVPagesObject *)alloc_instance(KVPagesType);
    if (!p) return NULL;
    p->pages = pages;
    p->dev = c->slot->type;
    p->dev_id = c->slot->type == KVA_DEVICE_CPU ? 0 : c->slot->device_id;
    Py_INCREF(o);
    p->keep = o;
    return (PyObject *)p;
}

/* ------------------------------------------------------------------------------------------ */
/* PoolView: one layer's K or V pool exported through DLPack (no copy)                          */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *keep; /* the cache */
    void *data;
    kva_device_type dev;
    int dev_id;
    kva_dtype dtype;
    int64_t shape[4], strides[4];
} PoolViewObject;

static PyTypeObject *PoolViewType;

/* What a capsule owns: the managed tensor (either layout) plus its shape and strides. */
typedef struct export_block {
    union {
        dl_managed legacy;
        dl_managed_v versioned;
    } m;
    int64_t shape[4], strides[4];
} export_block;

static void export_release(void *ctx_obj, export_block *b) {
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)ctx_obj);
    PyGILState_Release(g);
    free(b);
}
static void export_deleter_legacy(dl_managed *m) { export_release(m->manager_ctx, (export_block *)m); }
static void export_deleter_versioned(dl_managed_v *m) { export_release(m->manager_ctx, (export_block *)m); }

static void capsule_legacy_destructor(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) { /* never consumed */
        dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
        m->deleter(m);
    }
}
static void capsule_versioned_destructor(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        dl_managed_v *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        m->deleter(m);
    }
}

static PyObject *poolview_dlpack(PyObject *o, PyObject *args, PyObject *kw) {
    static char *kws[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *maxv = Py_None, *dl_dev = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO", kws, &stream, &maxv, &dl_dev, &copy)) return NULL;
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "kvattn pool views are exported without copying");
        return NULL;
    }
    PoolViewObject *v = (PoolViewObject *)o;
    int versioned = 0;
    if (maxv != Py_None) {
        PyObject *major = PySequence_GetItem(maxv, 0);
        if (!major) return NULL;
        versioned = PyLong_AsLong(major) >= 1;
        Py_DECREF(major);
    }
    export_block *b = calloc(1, sizeof *b);
    if (!b) return PyErr_NoMemory();
    memcpy(b->shape, v->shape, sizeof b->shape);
    memcpy(b->strides, v->strides, sizeof b->strides);
    dl_tensor t = {0};
    t.data = v->data;
    t.device.device_type = v->dev == KVA_DEVICE_CUDA ? DL_CUDA : DL_CPU;
    t.device.device_id = v->dev == KVA_DEVICE_CUDA ? v->dev_id : 0;
    t.ndim = 4;
    t.dtype.code = v->dtype == KVA_BF16 ? DL_BFLOAT : DL_FLOAT;
    t.dtype.bits = v->dtype == KVA_F32 ? 32 : 16;
    t.dtype.lanes = 1;
    t.shape = b->shape;
    t.strides = b->strides;
    Py_INCREF(o);
    PyObject *cap;
    if (versioned) {
        b->m.versioned.major = 1;
        b->m.versioned.minor = 0;
        b->m.versioned.manager_ctx = o;
        b->m.versioned.deleter = export_deleter_versioned;
        b->m.versioned.t = t;
        cap = PyCapsule_New(&b->m.versioned, "dltensor_versioned", capsule_versioned_destructor);
    } else {
        b->m.legacy.t = t;
        b->m.legacy.manager_ctx = o;
        b->m.legacy.deleter = export_deleter_legacy;
        cap = PyCapsule_New(&b->m.legacy, "dltensor", capsule_legacy_destructor);
    }
    if (!cap) {
        Py_DECREF(o);
        free(b);
    }
    return cap;
}

static PyObject *poolview_dlpack_device(PyObject *o, PyObject *unused) {
    (void)unused;
    PoolViewObject *v = (PoolViewObject *)o;
    return Py_BuildValue("(ii)", v->dev == KVA_DEVICE_CUDA ? DL_CUDA : DL_CPU,
                         v->dev == KVA_DEVICE_CUDA ? v->dev_id : 0);
}

static PyObject *poolview_shape(PyObject *o, void *c) {
    (void)c;
    PoolViewObject *v = (PoolViewObject *)o;
    return Py_BuildValue("(LLLL)", (long long)v->shape[0], (long long)v->shape[1], (long long)v->shape[2],
                         (long long)v->shape[3]);
}

static void poolview_dealloc(PyObject *o) {
    Py_CLEAR(((PoolViewObject *)o)->keep);
    generic_dealloc(o);
}

static PyMethodDef poolview_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))poolview_dlpack, METH_VARARGS | METH_KEYWORDS, NULL},
    {"__dlpack_device__", poolview_dlpack_device, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};
static PyGetSetDef poolview_getset[] = {{"shape", poolview_shape, NULL, NULL, NULL}, {NULL, NULL, NULL, NULL, NULL}};
static PyType_Slot poolview_slots[] = {
    {Py_tp_dealloc, poolview_dealloc},
    {Py_tp_methods, poolview_methods},
    {Py_tp_getset, poolview_getset},
    {Py_tp_doc, "One layer's K or V page pool, [num_pages, page_size, kv_heads, head_dim] (NHD) or "
                "[num_pages, kv_heads, page_size, head_dim] (HND), strided, exported through DLPack "
                "without a copy (numpy.from_dlpack, torch.from_dlpack, ...). Keeps its cache alive."},
    {0, NULL}};
static PyType_Spec poolview_spec = {"kvattn._ext.PoolView", sizeof(PoolViewObject), 0, Py_TPFLAGS_DEFAULT,
                                    poolview_slots};

/* cache.pool_views(layer) -> (k, v) PoolView objects of that layer */
static PyObject *cache_pool_views(PyObject *o, PyObject *arg) {
    CacheObject *c = (CacheObject *)o;
    int32_t layer;
    if (arg_i32(arg, "layer", &layer) < 0) return NULL;
    kva_kv_pages pages;
    kva_status st = kva_cache_layer_pages(c->cache, layer, &pages);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    int hnd = c->cfg.layout == KVA_LAYOUT_HND;
    PyObject *out[2];
    for (int i = 0; i < 2; ++i) {
        PoolViewObject *v = (PoolViewObject *)alloc_instance(PoolViewType);
        if (!v) {
            if (i) Py_DECREF(out[0]);
            return NULL;
        }
        Py_INCREF(o);
        v->keep = o;
        v->data = i ? pages.v_data : pages.k_data;
        v->dev = c->slot->type;
        v->dev_id = c->slot->type == KVA_DEVICE_CPU ? 0 : c->slot->device_id;
        v->dtype = pages.dtype;
        v->shape[0] = pages.num_pages;
        v->shape[1] = hnd ? pages.num_kv_heads : pages.page_size;
        v->shape[2] = hnd ? pages.page_size : pages.num_kv_heads;
        v->shape[3] = pages.head_dim;
        v->strides[0] = pages.stride_page;
        v->strides[1] = hnd ? pages.stride_head : pages.stride_token;
        v->strides[2] = hnd ? pages.stride_token : pages.stride_head;
        v->strides[3] = 1;
        out[i] = (PyObject *)v;
    }
    return Py_BuildValue("(NN)", out[0], out[1]);
}

static PyMethodDef cache_methods[] = {
    {"add_sequence", cache_add, METH_NOARGS, NULL},
    {"free_sequence", cache_free_seq, METH_O, NULL},
    {"fork", cache_fork, METH_O, NULL},
    {"reserve", cache_reserve, METH_VARARGS, NULL},
    {"append", (PyCFunction)(void (*)(void))cache_append, METH_VARARGS | METH_KEYWORDS, NULL},
    {"seq_len", cache_seq_len, METH_O, NULL},
    {"page_table", cache_page_table, METH_O, NULL},
    {"stats", cache_stats, METH_NOARGS, NULL},
    {"prefault", cache_prefault, METH_NOARGS, NULL},
    {"page_refcount", cache_refcount, METH_O, NULL},
    {"layer_pages", cache_layer_pages, METH_O, NULL},
    {"pool_views", cache_pool_views, METH_O, NULL},
    {NULL, NULL, 0, NULL}};

static PyType_Slot cache_slots[] = {
    {Py_tp_new, cache_new},
    {Py_tp_dealloc, cache_dealloc},
    {Py_tp_methods, cache_methods},
    {Py_tp_doc, "Low-level kva_cache handle; use kvattn.PagedKVCache."},
    {0, NULL}};
static PyType_Spec cache_spec = {"kvattn._ext.Cache", sizeof(CacheObject), 0, Py_TPFLAGS_DEFAULT, cache_slots};

/* ------------------------------------------------------------------------------------------ */
/* Variant: a kva_variant (GPU score modifier compiled with NVRTC) and its default caller data  */
/* ------------------------------------------------------------------------------------------ */

/* The context of a variant is one of this module's per-device contexts, which live until the
 * process ends; `slot` is that reference (the library also keeps a context alive while a
 * variant of it exists). `data` is the score_mod_user a call gets when it names no other:
 * device memory owned here (a copy of host data), a caller's CUDA array kept alive by
 * `data_obj`, a raw address, or NULL. */
typedef struct {
    PyObject_HEAD
    kva_variant *v;
    ctx_slot *slot;
    void *data;
    void *own_data;     /* kva_malloc'd copy of host data, freed on dealloc */
    size_t data_bytes;  /* bytes of own_data or of a CUDA array given as data (0: unknown) */
    PyObject *data_obj; /* the CUDA array `data` points into, or NULL */
} VariantObject;

static PyTypeObject *VariantType;

static void variant_dealloc(PyObject *o) {
    VariantObject *v = (VariantObject *)o;
    /* A run enqueued with this variant may still be in flight. Kernels launched before keep
     * running: the compiled modules belong to the context until it is freed (never, here), and
     * cudaFree (kva_free) waits for the device before it releases the copied data. */
    kva_variant_destroy(v->v);
    if (v->own_data) kva_free(v->slot->ctx, v->own_data);
    Py_CLEAR(v->data_obj);
    generic_dealloc(o);
}

static int is_plain_int(PyObject *o) { return PyLong_Check(o) && !PyBool_Check(o); }

/* A device address for score_mod_user from `o` for a call on CUDA slot s: an int (an address
 * in device memory, taken as given) or a CUDA array on s's device (its data pointer; the caller
 * keeps the array alive while runs that use it are in flight). `stream` is the call's stream
 * (handed to __dlpack__). */
static int device_data_ptr(PyObject *o, const ctx_slot *s, void *stream, const char *name, void **out,
                           size_t *bytes) {
    if (bytes) *bytes = 0;
    if (is_plain_int(o)) {
        *out = PyLong_AsVoidPtr(o);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (!is_torch_tensor(o) && !PyObject_HasAttr(o, s_dlpack)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a CUDA array (torch, CuPy, JAX, ...) or an int device address, got %S", name,
                     (PyObject *)Py_TYPE(o));
        return -1;
    }
    call_state cs = {.have_stream = 1, .stream = stream};
    view v;
    if (view_get(o, &v, &cs, name) < 0) return -1;
    if (v.dev != KVA_DEVICE_CUDA || v.dev_id != s->device_id) {
        view_release(&v);
        if (v.dev == KVA_DEVICE_CPU)
            PyErr_Format(PyExc_ValueError,
                         "%s: an array in host memory; the variant reads device memory of cuda:%d "
                         "(pass a CUDA array or an int device address)",
                         name, s->device_id);
        else
            PyErr_Format(PyExc_ValueError, "%s: an array on cuda:%d; this call runs on cuda:%d", name, v.dev_id,
                         s->device_id);
        return -1;
    }
    *out = v.data;
    if (bytes && v.el != EL_OTHER) {
        size_t n = 1;
        for (int i = 0; i < v.ndim; ++i) n *= (size_t)v.shape[i];
        *bytes = n * (size_t)el_size(v.el);
    }
    view_release(&v);
    return 0;
}

/* Copies host data (bytes, or a contiguous host array of a known dtype) into new device memory
 * of slot s: *out (NULL for 0 bytes). Returns 1 if `o` was host data, 0 if it is something else
 * (nothing done), -1 on error. */
static int copy_host_data(PyObject *o, ctx_slot *s, void **out, size_t *bytes) {
    const char *src = NULL;
    size_t n = 0;
    view v;
    int have_view = 0;
    if (PyBytes_Check(o)) {
        char *p;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(o, &p, &len) < 0) return -1;
        src = p;
        n = (size_t)len;
    } else if (is_torch_tensor(o) || PyObject_HasAttr(o, s_dlpack)) {
        call_state cs = {0};
        if (view_get(o, &v, &cs, "data") < 0) return -1;
        if (v.dev != KVA_DEVICE_CPU) {
            view_release(&v);
            return 0;
        }
        have_view = 1;
        if (v.el == EL_OTHER) {
            view_release(&v);
            PyErr_SetString(PyExc_TypeError, "data: host arrays of float32, float16, bfloat16, int32 or int64 "
                                             "are copied to the device; pass bytes for other layouts");
            return -1;
        }
        int64_t run = 1;
        for (int i = v.ndim - 1; i >= 0; --i) {
            if (v.shape[i] > 1 && v.strides[i] != run) {
                view_release(&v);
                PyErr_SetString(PyExc_ValueError, "data: a host array must be contiguous to be copied");
                return -1;
            }
            run *= v.shape[i];
        }
        src = v.data;
        n = (size_t)run * (size_t)el_size(v.el);
    } else {
        return 0;
    }
    *out = NULL;
    *bytes = n;
    kva_status st = KVA_OK;
    if (n) {
        void *stream;
        if (slot_stream(s, Py_None, &stream) < 0) {
            if (have_view) view_release(&v);
            return -1;
        }
        kva_context_set_stream(s->ctx, stream);
        st = kva_malloc(s->ctx, n, out);
        if (st == KVA_OK) st = kva_memcpy(s->ctx, *out, src, n, KVA_COPY_HOST_TO_DEVICE); /* waits */
        if (st != KVA_OK && *out) {
            kva_free(s->ctx, *out);
            *out = NULL;
        }
    }
    if (have_view) view_release(&v);
    if (st != KVA_OK) {
        raise_status(st, kva_last_error());
        return -1;
    }
    return 1;
}

/* Variant(device_type, device_id, source, function, kinds=0, dtypes=0, head_dim=0, data=None):
 * kva_variant_create, or kva_variant_create_alibi when source is None. data: the default caller
 * data (None; bytes or a host array: copied to the device; a CUDA array: referenced; an int
 * device address). Compiles while holding the GIL: CUDA contexts serve one thread at a time and
 * this binding serialises CUDA calls with the GIL. */
static PyObject *variant_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kws[] = {"device_type", "device_id", "source", "function", "kinds", "dtypes", "head_dim", "data",
                          NULL};
    PyObject *dt, *src_o, *fn_o = Py_None, *data = Py_None;
    int dev_id;
    unsigned int kinds = 0, dtypes = 0;
    int head_dim = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OiO|OIIiO", kws, &dt, &dev_id, &src_o, &fn_o, &kinds, &dtypes,
                                     &head_dim, &data))
        return NULL;
    PyObject *src_b = NULL, *fn_b = NULL; /* UTF-8 bytes of source and function */
    if (src_o != Py_None) {
        if (!PyUnicode_Check(src_o) || !PyUnicode_Check(fn_o)) {
            PyErr_SetString(PyExc_TypeError, "Variant: source and function must be str");
            return NULL;
        }
        src_b = PyUnicode_AsUTF8String(src_o);
        fn_b = src_b ? PyUnicode_AsUTF8String(fn_o) : NULL;
        if (!fn_b) {
            Py_XDECREF(src_b);
            return NULL;
        }
        if ((size_t)PyBytes_Size(src_b) != strlen(PyBytes_AsString(src_b)) ||
            (size_t)PyBytes_Size(fn_b) != strlen(PyBytes_AsString(fn_b))) {
            Py_DECREF(src_b);
            Py_DECREF(fn_b);
            PyErr_SetString(PyExc_ValueError, "Variant: source or function contains a NUL character");
            return NULL;
        }
    }
    kva_device_type dev;
    ctx_slot *s = NULL;
    VariantObject *self = NULL;
    if (parse_device(dt, dev_id, &dev) == 0 && (s = get_slot(dev, dev_id)) != NULL)
        self = (VariantObject *)alloc_instance(tp);
    if (!self) {
        Py_XDECREF(src_b);
        Py_XDECREF(fn_b);
        return NULL;
    }
    self->slot = s;
    kva_variant_options opt = {kinds, dtypes, head_dim};
    kva_status st = src_b ? kva_variant_create(s->ctx, PyBytes_AsString(src_b), PyBytes_AsString(fn_b), &opt,
                                               &self->v)
                          : kva_variant_create_alibi(s->ctx, &opt, &self->v);
    Py_XDECREF(src_b);
    Py_XDECREF(fn_b);
    if (st != KVA_OK) {
        raise_status(st, kva_last_error());
        Py_DECREF(self);
        return NULL;
    }
    if (data != Py_None) {
        int rc = copy_host_data(data, s, &self->own_data, &self->data_bytes);
        if (rc < 0) {
            Py_DECREF(self);
            return NULL;
        }
        if (rc == 1) {
            self->data = self->own_data;
        } else if (!is_plain_int(data) && !is_torch_tensor(data) && !PyObject_HasAttr(data, s_dlpack)) {
            PyErr_Format(PyExc_TypeError,
                         "data: expected bytes or a host array (copied to the device), a CUDA array "
                         "(referenced) or an int device address, got %S",
                         (PyObject *)Py_TYPE(data));
            Py_DECREF(self);
            return NULL;
        } else {
            void *stream;
            if (slot_stream(s, Py_None, &stream) < 0 ||
                device_data_ptr(data, s, stream, "data", &self->data, &self->data_bytes) < 0) {
                Py_DECREF(self);
                return NULL;
            }
            if (!is_plain_int(data)) {
                Py_INCREF(data);
                self->data_obj = data;
            }
        }
    }
    return (PyObject *)self;
}

static PyObject *variant_stats(PyObject *o, PyObject *unused) {
    (void)unused;
    kva_variant_stats s;
    kva_status st = kva_variant_get_stats(((VariantObject *)o)->v, &s);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:d,s:d}", "modules", s.modules, "compiled", s.compiled, "disk_hits",
                         s.disk_hits, "context_hits", s.context_hits, "compile_ms", s.compile_ms, "total_ms",
                         s.total_ms);
}

static PyObject *variant_data_ptr_get(PyObject *o, void *c) {
    (void)c;
    return PyLong_FromVoidPtr(((VariantObject *)o)->data);
}

static PyObject *variant_data_bytes_get(PyObject *o, void *c) {
    (void)c;
    return PyLong_FromSize_t(((VariantObject *)o)->data_bytes);
}

static PyObject *variant_device_id_get(PyObject *o, void *c) {
    (void)c;
    return PyLong_FromLong(((VariantObject *)o)->slot->device_id);
}

static PyMethodDef variant_methods[] = {{"stats", variant_stats, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static PyGetSetDef variant_getset[] = {
    {"data_ptr", variant_data_ptr_get, NULL, "int: the default caller data's device address (0: none)", NULL},
    {"data_bytes", variant_data_bytes_get, NULL, "int: its size in bytes when known (copied data, arrays), else 0",
     NULL},
    {"device_id", variant_device_id_get, NULL, "int: the CUDA device it was compiled for", NULL},
    {NULL, NULL, NULL, NULL, NULL}};
static PyType_Slot variant_slots[] = {
    {Py_tp_new, variant_new},
    {Py_tp_dealloc, variant_dealloc},
    {Py_tp_methods, variant_methods},
    {Py_tp_getset, variant_getset},
    {Py_tp_doc, "Low-level kva_variant handle; use kvattn.Variant."},
    {0, NULL}};
static PyType_Spec variant_spec = {"kvattn._ext.Variant", sizeof(VariantObject), 0, Py_TPFLAGS_DEFAULT,
                                   variant_slots};

/* params->variant and ->score_mod_user from a call's variant= and variant_data= on slot s (the
 * call's context) with the call's stream. variant None: no variant (variant_data must be None
 * too). variant_data None: the variant's default data. */
static int apply_variant(const ctx_slot *s, void *stream, PyObject *variant, PyObject *data,
                         kva_attn_params *params) {
    if (!variant || variant == Py_None) {
        if (data && data != Py_None) {
            PyErr_SetString(PyExc_ValueError, "variant_data= given without variant=");
            return -1;
        }
        return 0;
    }
    if (Py_TYPE(variant) != VariantType) {
        PyErr_Format(PyExc_TypeError, "variant: expected a kvattn.Variant, got %S", (PyObject *)Py_TYPE(variant));
        return -1;
    }
    const VariantObject *v = (const VariantObject *)variant;
    if (s->type != KVA_DEVICE_CUDA) {
        PyErr_Format(PyExc_ValueError,
                     "variant: a kvattn.Variant runs on CUDA (this one on cuda:%d) but this call runs on the CPU; "
                     "CPU calls take only the built-in causal, window_left and soft_cap",
                     v->slot->device_id);
        return -1;
    }
    if (v->slot != s) {
        PyErr_Format(PyExc_ValueError, "variant: compiled for cuda:%d but this call runs on cuda:%d",
                     v->slot->device_id, s->device_id);
        return -1;
    }
    params->variant = v->v;
    params->score_mod_user = v->data;
    if (data && data != Py_None) {
        void *p;
        if (device_data_ptr(data, s, stream, "variant_data", &p, NULL) < 0) return -1;
        params->score_mod_user = p;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Workspace: owns a kva_workspace and the plan made into it                                    */
/* ------------------------------------------------------------------------------------------ */

enum { WS_DECODE = 0, WS_PREFILL = 1 };

typedef struct {
    PyObject_HEAD
    ctx_slot *slot;
    int kind;
    kva_plan_limits lim;
    kva_workspace ws;
    kva_plan plan;
    int planned;      /* 0 none, 1 decode, 2 prefill ragged, 3 prefill paged */
    kva_attn_params params;
    int hnd;          /* page layout given to plan() (for tuple / interleaved pages) */
    int64_t total_qo; /* rows of q the plan expects */
    int64_t total_kv; /* ragged prefill: rows of k/v */
    void *last_stream; /* CUDA: the stream of the latest plan or run (waited for on dealloc) */
    PyObject *variant_obj;      /* the plan's kvattn._ext.Variant (params.variant), or NULL */
    PyObject *variant_data_obj; /* the CUDA array params.score_mod_user points into, or NULL */
} WorkspaceObject;

static PyTypeObject *WorkspaceType;

static void workspace_dealloc(PyObject *o) {
    WorkspaceObject *w = (WorkspaceObject *)o;
    if (w->slot) {
        if (w->slot->type == KVA_DEVICE_CUDA) { /* runs may be in flight */
            kva_context_set_stream(w->slot->ctx, w->last_stream);
            kva_synchronize(w->slot->ctx);
        }
        kva_free(w->slot->ctx, w->ws.device);
        kva_host_free(w->slot->ctx, w->ws.host);
    }
    Py_CLEAR(w->variant_obj); /* after the wait: no run of this workspace uses them any more */
    Py_CLEAR(w->variant_data_obj);
    generic_dealloc(o);
}

static PyObject *workspace_new(PyTypeObject *tp, PyObject *args, PyObject *kw) {
    static char *kws[] = {"device_type", "device_id", "kind", "max_batch", "max_total_pages",
                          "max_total_kv", "max_total_qo", "num_qo_heads", "num_kv_heads", "head_dim",
                          "page_size", NULL};
    PyObject *dt;
    int dev_id, kind;
    kva_plan_limits l = {0};
    long long pages, kv, qo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OiiiLLLiiii", kws, &dt, &dev_id, &kind, &l.max_batch, &pages,
                                     &kv, &qo, &l.num_qo_heads, &l.num_kv_heads, &l.head_dim, &l.page_size))
        return NULL;
    l.max_total_pages = pages;
    l.max_total_kv = kv;
    l.max_total_qo = qo;
    kva_device_type dev;
    if (parse_device(dt, dev_id, &dev) < 0) return NULL;
    ctx_slot *s = get_slot(dev, dev_id);
    if (!s) return NULL;
    kva_workspace ws = {0};
    kva_status st = kind == WS_DECODE
                        ? kva_decode_workspace_size(s->ctx, &l, &ws.device_bytes, &ws.host_bytes)
                        : kva_prefill_workspace_size(s->ctx, &l, &ws.device_bytes, &ws.host_bytes);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    WorkspaceObject *w = (WorkspaceObject *)alloc_instance(tp);
    if (!w) return NULL;
    w->kind = kind;
    w->lim = l;
    st = kva_malloc(s->ctx, ws.device_bytes ? ws.device_bytes : 64, &ws.device);
    if (st == KVA_OK) st = kva_host_alloc(s->ctx, ws.host_bytes ? ws.host_bytes : 64, &ws.host);
    w->ws = ws;
    w->slot = s; /* after the allocations: dealloc frees what is set */
    if (st != KVA_OK) {
        Py_DECREF(w);
        return raise_status(st, kva_last_error());
    }
    w->params = kva_attn_params_default(l.num_qo_heads, l.num_kv_heads, l.head_dim);
    return (PyObject *)w;
}

static int parse_options(int no_split, int graph, int fixed_chunk, int algo, kva_plan_options *o) {
    o->flags = (no_split ? KVA_PLAN_NO_SPLIT : 0) | (graph ? KVA_PLAN_GRAPH : 0);
    o->fixed_chunk_size = fixed_chunk;
    o->algo = algo ? KVA_DECODE_GLOBAL_ROWMAX : KVA_DECODE_PARTIAL_ROWMAX;
    return 0;
}

static int set_params(WorkspaceObject *w, int hq, int hk, int d, double sm_scale, int causal, int window,
                      double cap) {
    w->params = kva_attn_params_default(hq, hk, d);
    w->params.sm_scale = (float)sm_scale;
    w->params.causal = causal;
    w->params.window_left = window;
    w->params.logits_soft_cap = (float)cap;
    return 0;
}

/* After a successful plan: the variant of `vp` (checked by apply_variant before planning) joins
 * the plan's params, and the workspace keeps the variant and its data array alive for as long as
 * the plan may run (CUDA graphs replay it). */
static void workspace_set_variant(WorkspaceObject *w, const kva_attn_params *vp, PyObject *variant, PyObject *data) {
    PyObject *old_v = w->variant_obj, *old_d = w->variant_data_obj;
    w->params.variant = vp->variant;
    w->params.score_mod_user = vp->score_mod_user;
    w->variant_obj = NULL;
    w->variant_data_obj = NULL;
    if (vp->variant) {
        Py_INCREF(variant);
        w->variant_obj = variant;
        if (data && data != Py_None && !is_plain_int(data)) {
            Py_INCREF(data);
            w->variant_data_obj = data;
        }
    }
    Py_XDECREF(old_v);
    Py_XDECREF(old_d);
}

/* A run's params: the plan's, with score_mod_user replaced when the run passes variant_data. */
static int run_params(WorkspaceObject *w, PyObject *data, void *stream, kva_attn_params *p) {
    *p = w->params;
    if (data == Py_None) return 0;
    if (!p->variant) {
        PyErr_SetString(PyExc_ValueError, "variant_data= given to run() but the plan has no variant");
        return -1;
    }
    return device_data_ptr(data, w->slot, stream, "variant_data", &p->score_mod_user, NULL);
}

/* plan_decode(indptr, indices, last_page_len, num_pages, num_qo_heads, num_kv_heads, head_dim,
 *             page_size, sm_scale, window_left, soft_cap, hnd, no_split, graph, fixed_chunk, algo)
 * or with cache=, seq_ids= instead of the three arrays. */
static PyObject *workspace_plan_decode(PyObject *o, PyObject *args, PyObject *kw) {
    static char *kws[] = {"indptr", "indices", "last_page_len", "num_pages", "num_qo_heads", "num_kv_heads",
                          "head_dim", "page_size", "sm_scale", "window_left", "soft_cap", "hnd",
                          "no_split", "graph", "fixed_chunk", "algo", "cache", "stream", "variant",
                          "variant_data", NULL};
    WorkspaceObject *w = (WorkspaceObject *)o;
    w->planned = 0; /* a failed plan leaves none (the library's rule), whichever check fails */
    PyObject *indptr_o, *indices_o, *last_o, *cache_o = Py_None, *stream = Py_None, *variant = Py_None,
             *vdata = Py_None;
    int num_pages, hq, hk, d, ps, window = -1, hnd = 0, no_split = 0, graph = 0, fixed = 0, algo = 0;
    double sm = 0, cap = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOiiiii|didpppiiOOOO", kws, &indptr_o, &indices_o, &last_o,
                                     &num_pages, &hq, &hk, &d, &ps, &sm, &window, &cap, &hnd, &no_split,
                                     &graph, &fixed, &algo, &cache_o, &stream, &variant, &vdata))
        return NULL;
    if (w->kind != WS_DECODE) {
        PyErr_SetString(PyExc_TypeError, "plan_decode on a prefill workspace");
        return NULL;
    }
    kva_plan_options opt;
    parse_options(no_split, graph, fixed, algo, &opt);
    kva_plan_limits lim = w->lim;
    lim.num_qo_heads = hq;
    lim.num_kv_heads = hk;
    lim.head_dim = d;
    lim.page_size = ps;
    kva_page_table t;
    i32arr a = {0}, b = {0}, c = {0};
    if (cache_o != Py_None) {
        if (Py_TYPE(cache_o) != CacheType) {
            PyErr_SetString(PyExc_TypeError, "cache: expected a kvattn._ext.Cache");
            return NULL;
        }
        if (cache_table((CacheObject *)cache_o, indptr_o, &t, &a) < 0) return NULL;
    } else {
        if (i32_get(indptr_o, &a, "indptr") < 0 || i32_get(indices_o, &b, "indices") < 0 ||
            i32_get(last_o, &c, "last_page_len") < 0)
            goto fail;
        if (a.n < 1 || c.n != a.n - 1) {
            PyErr_SetString(PyExc_ValueError, "indptr must have batch+1 entries, last_page_len batch");
            goto fail;
        }
        if (b.n < a.p[a.n - 1]) {
            PyErr_SetString(PyExc_ValueError, "indices is shorter than indptr[-1]");
            goto fail;
        }
        t.batch_size = (int32_t)(a.n - 1);
        t.indptr = a.p;
        t.indices = b.p;
        t.last_page_len = c.p;
    }
    kva_status st;
    void *pstream;
    if (slot_stream(w->slot, stream, &pstream) < 0) goto fail;
    kva_attn_params vp = {0};
    if (apply_variant(w->slot, pstream, variant, vdata, &vp) < 0) goto fail;
    w->planned = 0;
    w->last_stream = pstream;
    SLOT_CALL(w->slot, pstream, st, kva_decode_plan(w->slot->ctx, &lim, &t, num_pages, &opt, w->ws, &w->plan));
    i32_free(&a);
    i32_free(&b);
    i32_free(&c);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    set_params(w, hq, hk, d, sm, 0, window, cap);
    workspace_set_variant(w, &vp, variant, vdata);
    w->hnd = hnd;
    w->planned = 1;
    w->total_qo = t.batch_size;
    Py_RETURN_NONE;
fail:
    i32_free(&a);
    i32_free(&b);
    i32_free(&c);
    return NULL;
}

/* plan_prefill(qo_indptr, kv_indptr | None, indptr, indices, last_page_len, num_pages, heads...) */
static PyObject *workspace_plan_prefill(PyObject *o, PyObject *args, PyObject *kw) {
    static char *kws[] = {"qo_indptr", "kv_indptr", "indptr", "indices", "last_page_len", "num_pages",
                          "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "causal", "sm_scale",
                          "window_left", "soft_cap", "hnd", "no_split", "graph", "fixed_chunk", "cache",
                          "seq_ids", "stream", "variant", "variant_data", NULL};
    WorkspaceObject *w = (WorkspaceObject *)o;
    w->planned = 0; /* a failed plan leaves none (the library's rule), whichever check fails */
    PyObject *qo_o, *kv_o, *indptr_o, *indices_o, *last_o, *cache_o = Py_None, *ids_o = Py_None,
             *stream = Py_None, *variant = Py_None, *vdata = Py_None;
    int num_pages, hq, hk, d, ps, causal = 0, window = -1, hnd = 0, no_split = 0, graph = 0, fixed = 0;
    double sm = 0, cap = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOiiiii|pdidpppiOOOOO", kws, &qo_o, &kv_o, &indptr_o,
                                     &indices_o, &last_o, &num_pages, &hq, &hk, &d, &ps, &causal, &sm, &window,
                                     &cap, &hnd, &no_split, &graph, &fixed, &cache_o, &ids_o, &stream, &variant,
                                     &vdata))
        return NULL;
    if (w->kind != WS_PREFILL) {
        PyErr_SetString(PyExc_TypeError, "plan_prefill on a decode workspace");
        return NULL;
    }
    kva_plan_options opt;
    parse_options(no_split, graph, fixed, 0, &opt);
    /* (the runs this plan is for see every key: the scheduling hint, kvattn.h) */
    if (!causal && window < 0) opt.flags |= KVA_PLAN_FULL_ATTENTION;
    kva_plan_limits lim = w->lim;
    lim.num_qo_heads = hq;
    lim.num_kv_heads = hk;
    lim.head_dim = d;
    if (w->lim.page_size) lim.page_size = ps;
    i32arr qo = {0}, kv = {0}, a = {0}, b = {0}, c = {0};
    kva_page_table t, *tp = NULL;
    if (i32_get(qo_o, &qo, "qo_indptr") < 0) return NULL;
    if (qo.n < 1) {
        PyErr_SetString(PyExc_ValueError, "qo_indptr: needs batch+1 entries");
        goto fail;
    }
    int32_t batch = (int32_t)(qo.n - 1);
    if (kv_o != Py_None) {
        if (i32_get(kv_o, &kv, "kv_indptr") < 0) goto fail;
        if (kv.n != qo.n) {
            PyErr_SetString(PyExc_ValueError, "kv_indptr and qo_indptr differ in length");
            goto fail;
        }
    } else if (cache_o != Py_None) {
        if (Py_TYPE(cache_o) != CacheType) {
            PyErr_SetString(PyExc_TypeError, "cache: expected a kvattn._ext.Cache");
            goto fail;
        }
        if (cache_table((CacheObject *)cache_o, ids_o, &t, &a) < 0) goto fail;
        tp = &t;
    } else {
        if (i32_get(indptr_o, &a, "indptr") < 0 || i32_get(indices_o, &b, "indices") < 0 ||
            i32_get(last_o, &c, "last_page_len") < 0)
            goto fail;
        if (a.n != qo.n || c.n != a.n - 1 || b.n < a.p[a.n - 1]) {
            PyErr_SetString(PyExc_ValueError, "paged table: indptr [batch+1], last_page_len [batch], "
                                              "indices [indptr[-1]] with batch from qo_indptr");
            goto fail;
        }
        t.batch_size = batch;
        t.indptr = a.p;
        t.indices = b.p;
        t.last_page_len = c.p;
        tp = &t;
    }
    if (tp && tp->batch_size != batch) {
        PyErr_SetString(PyExc_ValueError, "seq_ids and qo_indptr differ in batch size");
        goto fail;
    }
    if (!tp && !kv.p) {
        PyErr_SetString(PyExc_ValueError, "plan_prefill: give kv_indptr or a page table");
        goto fail;
    }
    kva_status st;
    void *pstream;
    if (slot_stream(w->slot, stream, &pstream) < 0) goto fail;
    kva_attn_params vp = {0};
    if (apply_variant(w->slot, pstream, variant, vdata, &vp) < 0) goto fail;
    w->planned = 0;
    w->last_stream = pstream;
    SLOT_CALL(w->slot, pstream, st,
              kva_prefill_plan(w->slot->ctx, &lim, batch, qo.p, tp ? NULL : kv.p, tp, num_pages, &opt, w->ws,
                               &w->plan));
    w->total_qo = qo.p[batch];
    w->total_kv = kv.p ? kv.p[batch] : 0;
    i32_free(&qo);
    i32_free(&kv);
    i32_free(&a);
    i32_free(&b);
    i32_free(&c);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    set_params(w, hq, hk, d, sm, causal, window, cap);
    workspace_set_variant(w, &vp, variant, vdata);
    w->hnd = hnd;
    w->planned = tp ? 3 : 2;
    Py_RETURN_NONE;
fail:
    i32_free(&qo);
    i32_free(&kv);
    i32_free(&a);
    i32_free(&b);
    i32_free(&c);
    return NULL;
}

/* The common run: q [total_qo, hq, d] -> out, with lse [total_qo, hq] optional. */
typedef struct run_args {
    view q, o, l, k, v;
    int nq, no, nl, nk, nv; /* which views to release */
    kva_tensor qt, ot, kt, vt;
    float *lse;
    kva_kv_pages pages;
    call_state cs;
} run_args;

static void run_release(run_args *r) {
    if (r->nq) view_release(&r->q);
    if (r->no) view_release(&r->o);
    if (r->nl) view_release(&r->l);
    if (r->nk) view_release(&r->k);
    if (r->nv) view_release(&r->v);
}

static int run_qo(WorkspaceObject *w, PyObject *q, PyObject *out, PyObject *lse, run_args *r) {
    const kva_attn_params *p = &w->params;
    if (view_get(q, &r->q, &r->cs, "q") < 0) return -1;
    r->nq = 1;
    if (check_float(&r->q, "q") < 0) return -1;
    if (as_kva_tensor(&r->q, "q", w->total_qo, p->num_qo_heads, p->head_dim, r->q.el, &r->qt) < 0) return -1;
    if (view_get(out, &r->o, &r->cs, "out") < 0) return -1;
    r->no = 1;
    if (as_kva_tensor(&r->o, "out", w->total_qo, p->num_qo_heads, p->head_dim, r->q.el, &r->ot) < 0) return -1;
    if (r->o.readonly) {
        PyErr_SetString(PyExc_ValueError, "out: read-only array");
        return -1;
    }
    const int held = f32_out(lse, &r->l, &r->cs, "lse", w->total_qo, p->num_qo_heads, 1, &r->lse);
    if (held < 0) return -1;
    r->nl = held;
    if (r->cs.dev != w->slot->type ||
        (r->cs.dev == KVA_DEVICE_CUDA && r->cs.dev_id != w->slot->device_id)) {
        PyErr_SetString(PyExc_ValueError, "q: not on the wrapper's device");
        return -1;
    }
    return 0;
}

static PyObject *workspace_decode_run(PyObject *o, PyObject *args, PyObject *kw) {
    static char *kws[] = {"q", "paged_kv", "out", "lse", "stream", "variant_data", NULL};
    WorkspaceObject *w = (WorkspaceObject *)o;
    PyObject *q, *kv, *out, *lse = Py_None, *stream = Py_None, *vdata = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOO", kws, &q, &kv, &out, &lse, &stream, &vdata)) return NULL;
    if (w->planned != 1) {
        PyErr_SetString(PyExc_RuntimeError, "run() before a successful plan()");
        return NULL;
    }
    run_args r = {0};
    r.cs.stream_arg = stream;
    PyObject *res = NULL;
    if (run_qo(w, q, out, lse, &r) < 0 || get_pages(kv, w->hnd, &r.cs, &r.pages) < 0) goto done;
    kva_attn_params p;
    if (run_params(w, vdata, r.cs.stream, &p) < 0) goto done;
    kva_status st;
    w->last_stream = r.cs.stream;
    SLOT_CALL(w->slot, r.cs.stream, st, kva_decode_run(w->slot->ctx, &w->plan, &p, r.qt, &r.pages, r.ot, r.lse));
    if (st != KVA_OK) {
        raise_status(st, kva_last_error());
        goto done;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    run_release(&r);
    return res;
}

static PyObject *workspace_prefill_run(PyObject *o, PyObject *args, PyObject *kw) {
    static char *kws[] = {"q", "k", "v", "out", "lse", "stream", "variant_data", NULL};
    WorkspaceObject *w = (WorkspaceObject *)o;
    PyObject *q, *k, *v, *out, *lse = Py_None, *stream = Py_None, *vdata = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOO", kws, &q, &k, &v, &out, &lse, &stream, &vdata))
        return NULL;
    if (w->planned != 2 && w->planned != 3) {
        PyErr_SetString(PyExc_RuntimeError, "run() before a successful plan()");
        return NULL;
    }
    run_args r = {0};
    r.cs.stream_arg = stream;
    PyObject *res = NULL;
    if (run_qo(w, q, out, lse, &r) < 0) goto done;
    kva_attn_params p;
    if (run_params(w, vdata, r.cs.stream, &p) < 0) goto done;
    kva_status st;
    w->last_stream = r.cs.stream;
    if (w->planned == 3) {
        if (v != Py_None) {
            PyErr_SetString(PyExc_ValueError, "paged plan: pass the paged K/V as k and v=None");
            goto done;
        }
        if (get_pages(k, w->hnd, &r.cs, &r.pages) < 0) goto done;
        SLOT_CALL(w->slot, r.cs.stream, st,
                  kva_prefill_run_paged(w->slot->ctx, &w->plan, &p, r.qt, &r.pages, r.ot, r.lse));
    } else {
        if (view_get(k, &r.k, &r.cs, "k") < 0) goto done;
        r.nk = 1;
        if (view_get(v, &r.v, &r.cs, "v") < 0) goto done;
        r.nv = 1;
        if (as_kva_tensor(&r.k, "k", w->total_kv, p.num_kv_heads, p.head_dim, r.q.el, &r.kt) < 0 ||
            as_kva_tensor(&r.v, "v", w->total_kv, p.num_kv_heads, p.head_dim, r.q.el, &r.vt) < 0)
            goto done;
        SLOT_CALL(w->slot, r.cs.stream, st,
                  kva_prefill_run_ragged(w->slot->ctx, &w->plan, &p, r.qt, r.kt, r.vt, r.ot, r.lse));
    }
    if (st != KVA_OK) {
        raise_status(st, kva_last_error());
        goto done;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    run_release(&r);
    return res;
}

/* Median nanoseconds of the bare kva_decode_run call (the arrays read once, no Python between
 * calls), for the host-overhead measurement of kvattn.bench. CPU: includes the kernel. */
static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static PyObject *workspace_time_decode_run(PyObject *o, PyObject *args, PyObject *kw) {
    static char *kws[] = {"q", "paged_kv", "out", "iters", "stream", NULL};
    WorkspaceObject *w = (WorkspaceObject *)o;
    PyObject *q, *kv, *out, *stream = Py_None;
    int iters = 1000;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|iO", kws, &q, &kv, &out, &iters, &stream)) return NULL;
    if (w->planned != 1 || iters < 1) {
        PyErr_SetString(PyExc_RuntimeError, "time_decode_run: plan first; iters >= 1");
        return NULL;
    }
    run_args r = {0};
    r.cs.stream_arg = stream;
    PyObject *res = NULL;
    double *t = malloc(sizeof(double) * (size_t)iters);
    if (!t) return PyErr_NoMemory();
    if (run_qo(w, q, out, Py_None, &r) < 0 || get_pages(kv, w->hnd, &r.cs, &r.pages) < 0) goto done;
    kva_status st = KVA_OK;
    for (int i = 0; i < iters && st == KVA_OK; ++i) {
        double t0 = now_ns();
        if (w->slot->type == KVA_DEVICE_CUDA) kva_context_set_stream(w->slot->ctx, r.cs.stream);
        st = kva_decode_run(w->slot->ctx, &w->plan, &w->params, r.qt, &r.pages, r.ot, NULL);
        t[i] = now_ns() - t0;
    }
    if (st != KVA_OK) {
        raise_status(st, kva_last_error());
        goto done;
    }
    qsort(t, (size_t)iters, sizeof(double), cmp_double);
    res = PyFloat_FromDouble(t[iters / 2]);
done:
    free(t);
    run_release(&r);
    return res;
}

/* invalidate(): the workspace holds no plan until the next successful plan_* call (what a failed
 * plan call leaves, as in the library: the package calls it first in every plan()). */
static PyObject *workspace_invalidate(PyObject *o, PyObject *unused) {
    (void)unused;
    ((WorkspaceObject *)o)->planned = 0;
    Py_RETURN_NONE;
}

static PyObject *workspace_info(PyObject *o, PyObject *unused) {
    (void)unused;
    WorkspaceObject *w = (WorkspaceObject *)o;
    return Py_BuildValue("{s:i,s:n,s:n,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:L,s:L}", "planned", w->planned,
                         "device_bytes", (Py_ssize_t)w->ws.device_bytes, "host_bytes",
                         (Py_ssize_t)w->ws.host_bytes, "batch_size", w->plan.batch_size, "kv_chunk_size",
                         w->plan.kv_chunk_size, "qo_tile_size", w->plan.qo_tile_size, "num_work",
                         w->plan.num_work, "padded_work", w->plan.padded_work, "split_kv", w->plan.split_kv,
                         "max_batch", w->lim.max_batch, "max_total_pages", (long long)w->lim.max_total_pages,
                         "max_total_qo", (long long)w->lim.max_total_qo);
}

static PyMethodDef workspace_methods[] = {
    {"plan_decode", (PyCFunction)(void (*)(void))workspace_plan_decode, METH_VARARGS | METH_KEYWORDS, NULL},
    {"plan_prefill", (PyCFunction)(void (*)(void))workspace_plan_prefill, METH_VARARGS | METH_KEYWORDS, NULL},
    {"decode_run", (PyCFunction)(void (*)(void))workspace_decode_run, METH_VARARGS | METH_KEYWORDS, NULL},
    {"prefill_run", (PyCFunction)(void (*)(void))workspace_prefill_run, METH_VARARGS | METH_KEYWORDS, NULL},
    {"time_decode_run", (PyCFunction)(void (*)(void))workspace_time_decode_run, METH_VARARGS | METH_KEYWORDS,
     NULL},
    {"info", workspace_info, METH_NOARGS, NULL},
    {"invalidate", workspace_invalidate, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyType_Slot workspace_slots[] = {
    {Py_tp_new, workspace_new},
    {Py_tp_dealloc, workspace_dealloc},
    {Py_tp_methods, workspace_methods},
    {Py_tp_doc, "Low-level plan holder (workspace + plan); use kvattn.BatchDecodeWrapper / "
                "BatchPrefillWrapper."},
    {0, NULL}};
static PyType_Spec workspace_spec = {"kvattn._ext.Workspace", sizeof(WorkspaceObject), 0, Py_TPFLAGS_DEFAULT,
                                     workspace_slots};

/* ------------------------------------------------------------------------------------------ */
/* Module functions                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* merge_states(v_in [rows, states, d], lse_in [rows, states], v_out [rows, d], lse_out|None) */
static PyObject *ext_merge_states(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *kws[] = {"v", "lse", "v_out", "lse_out", "stream", NULL};
    PyObject *v_o, *l_o, *vo_o, *lo_o = Py_None, *stream = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OO", kws, &v_o, &l_o, &vo_o, &lo_o, &stream)) return NULL;
    call_state cs = {.stream_arg = stream};
    view v, l, vo, lo;
    int nv = 0, nl = 0, nvo = 0, nlo = 0;
    PyObject *res = NULL;
    float *lse_out = NULL;
    if (view_get(v_o, &v, &cs, "v") < 0) goto done;
    nv = 1;
    if (check_float(&v, "v") < 0) goto done;
    if (v.ndim != 3 || v.strides[2] != 1 || v.strides[1] != v.shape[2] || v.strides[0] != v.shape[1] * v.shape[2]) {
        PyErr_SetString(PyExc_ValueError, "v: expected a contiguous [rows, states, head_dim] array");
        goto done;
    }
    int64_t rows = v.shape[0], states = v.shape[1], d = v.shape[2];
    float *lse_in;
    if (l_o == Py_None) { /* (f32_out takes None as "no array" and leaves l unset) */
        PyErr_SetString(PyExc_ValueError, "lse: merge_states needs the states' LSE, a float32 [rows, states] array");
        goto done;
    }
    const int held = f32_out(l_o, &l, &cs, "lse", rows, states, 0, &lse_in);
    if (held < 0) goto done;
    nl = held;
    if (view_get(vo_o, &vo, &cs, "v_out") < 0) goto done;
    nvo = 1;
    if (vo.el != v.el || vo.ndim != 2 || vo.shape[0] != rows || vo.shape[1] != d ||
        (d > 1 && vo.strides[1] != 1) || (rows > 1 && vo.strides[0] != d)) {
        PyErr_SetString(PyExc_ValueError, "v_out: expected a contiguous [rows, head_dim] array of v's dtype");
        goto done;
    }
    if (vo.readonly) {
        PyErr_SetString(PyExc_ValueError, "v_out: read-only array");
        goto done;
    }
    if (lo_o != Py_None) {
        if (view_get(lo_o, &lo, &cs, "lse_out") < 0) goto done;
        nlo = 1;
        if (lo.el != EL_F32 || lo.ndim != 1 || lo.shape[0] != rows || (rows > 1 && lo.strides[0] != 1)) {
            PyErr_SetString(PyExc_ValueError, "lse_out: expected a contiguous float32 [rows] array");
            goto done;
        }
        if (lo.readonly) {
            PyErr_SetString(PyExc_ValueError, "lse_out: read-only array");
            goto done;
        }
        lse_out = (float *)lo.data;
    }
    ctx_slot *s = get_slot(cs.dev, cs.dev_id);
    if (!s) goto done;
    kva_status st;
    SLOT_CALL(s, cs.stream, st,
              kva_merge_states(s->ctx, (int32_t)rows, (int32_t)states, (int32_t)d, el_kva(v.el), v.data, lse_in,
                               vo.data, lse_out));
    if (st != KVA_OK) {
        raise_status(st, kva_last_error());
        goto done;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    if (nv) view_release(&v);
    if (nl) view_release(&l);
    if (nvo) view_release(&vo);
    if (nlo) view_release(&lo);
    return res;
}

/* attention(q [Lq, hq, d], k [Lk, hk, d], v, out like q, lse f32 [Lq, hq] | None, causal, sm_scale,
 *           window_left, soft_cap, stream): kva_attention, one sequence, no plan and no workspace. */
static PyObject *ext_attention(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *kws[] = {"q", "k", "v", "out", "lse", "causal", "sm_scale", "window_left", "soft_cap",
                          "stream", "variant", "variant_data", NULL};
    PyObject *q_o, *k_o, *v_o, *o_o, *l_o = Py_None, *stream = Py_None, *variant = Py_None, *vdata = Py_None;
    int causal = 0, window = -1;
    double sm = 0, cap = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OpdidOOO", kws, &q_o, &k_o, &v_o, &o_o, &l_o, &causal, &sm,
                                     &window, &cap, &stream, &variant, &vdata))
        return NULL;
    run_args r = {0};
    r.cs.stream_arg = stream;
    PyObject *res = NULL;
    if (view_get(q_o, &r.q, &r.cs, "q") < 0) goto done;
    r.nq = 1;
    if (check_float(&r.q, "q") < 0) goto done;
    if (as_kva_tensor(&r.q, "q", -1, -1, -1, r.q.el, &r.qt) < 0) goto done;
    int64_t lq = r.q.shape[0], hq = r.q.shape[1], d = r.q.shape[2];
    if (view_get(k_o, &r.k, &r.cs, "k") < 0) goto done;
    r.nk = 1;
    if (as_kva_tensor(&r.k, "k", -1, -1, d, r.q.el, &r.kt) < 0) goto done;
    int64_t lk = r.k.shape[0], hk = r.k.shape[1];
    if (view_get(v_o, &r.v, &r.cs, "v") < 0) goto done;
    r.nv = 1;
    if (as_kva_tensor(&r.v, "v", lk, hk, d, r.q.el, &r.vt) < 0) goto done;
    if (view_get(o_o, &r.o, &r.cs, "out") < 0) goto done;
    r.no = 1;
    if (as_kva_tensor(&r.o, "out", lq, hq, d, r.q.el, &r.ot) < 0) goto done;
    if (r.o.readonly) {
        PyErr_SetString(PyExc_ValueError, "out: read-only array");
        goto done;
    }
    const int held = f32_out(l_o, &r.l, &r.cs, "lse", lq, hq, 1, &r.lse);
    if (held < 0) goto done;
    r.nl = held;
    if (lq > INT32_MAX || lk > INT32_MAX || hq > INT32_MAX || hk < 1 || hq % hk != 0) {
        PyErr_Format(PyExc_ValueError, "attention: %lld query heads are not a multiple of %lld KV heads "
                     "(or a length exceeds int32)", (long long)hq, (long long)hk);
        goto done;
    }
    ctx_slot *s = get_slot(r.cs.dev, r.cs.dev_id);
    if (!s) goto done;
    kva_attn_params p = kva_attn_params_default((int32_t)hq, (int32_t)hk, (int32_t)d);
    p.sm_scale = (float)sm;
    p.causal = causal;
    p.window_left = window;
    p.logits_soft_cap = (float)cap;
    if (apply_variant(s, r.cs.stream, variant, vdata, &p) < 0) goto done;
    kva_status st;
    SLOT_CALL(s, r.cs.stream, st,
              kva_attention(s->ctx, &p, (int32_t)lq, (int32_t)lk, r.qt, r.kt, r.vt, r.ot, r.lse));
    if (st != KVA_OK) {
        raise_status(st, kva_last_error());
        goto done;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    run_release(&r);
    return res;
}

static PyObject *ext_block_table_to_csr(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *bt_o, *len_o;
    int page_size;
    if (!PyArg_ParseTuple(args, "OOi", &bt_o, &len_o, &page_size)) return NULL;
    i32arr lens;
    if (i32_get(len_o, &lens, "context_lens") < 0) return NULL;
    int32_t batch = (int32_t)lens.n;
    /* the block table: a 2-D host int array, or a sequence of rows */
    int32_t *bt = NULL;
    int64_t width = 0;
    PyObject *res = NULL;
    if (is_torch_tensor(bt_o) || PyObject_HasAttr(bt_o, s_dlpack)) {
        call_state cs = {0};
        view v;
        if (view_get(bt_o, &v, &cs, "block_table") < 0) goto done;
        if (v.dev != KVA_DEVICE_CPU || v.ndim != 2 || v.shape[0] != batch || (v.el != EL_I32 && v.el != EL_I64)) {
            view_release(&v);
            PyErr_SetString(PyExc_ValueError, "block_table: expected a host int32/int64 [batch, max_blocks] array");
            goto done;
        }
        width = v.shape[1];
        bt = malloc(sizeof(int32_t) * (size_t)(batch * width + 1));
        if (!bt) {
            view_release(&v);
            PyErr_NoMemory();
            goto done;
        }
        for (int64_t i = 0; i < batch; ++i)
            for (int64_t j = 0; j < width; ++j) {
                int64_t off = i * v.strides[0] + j * v.strides[1];
                int64_t x = v.el == EL_I32 ? ((int32_t *)v.data)[off] : ((int64_t *)v.data)[off];
                if (x < INT32_MIN || x > INT32_MAX) {
                    view_release(&v);
                    PyErr_Format(PyExc_OverflowError, "block_table[%lld][%lld] = %lld does not fit int32",
                                 (long long)i, (long long)j, (long long)x);
                    goto done;
                }
                bt[i * width + j] = (int32_t)x;
            }
        view_release(&v);
    } else {
        PyObject *rows = PySequence_Fast(bt_o, "block_table: expected rows of ints");
        if (!rows) goto done;
        if (PySequence_Size(rows) != batch) {
            Py_DECREF(rows);
            PyErr_SetString(PyExc_ValueError, "block_table and context_lens differ in length");
            goto done;
        }
        for (int32_t i = 0; i < batch; ++i) {
            PyObject *r = PySequence_GetItem(rows, i);
            Py_ssize_t n = r ? PySequence_Size(r) : -1;
            Py_XDECREF(r);
            if (n < 0) {
                Py_DECREF(rows);
                goto done;
            }
            if (n > width) width = n;
        }
        /* short rows are padded with -1, which the library refuses where a block is needed
         * (padding with 0 would name page 0) */
        bt = malloc(sizeof(int32_t) * (size_t)(batch * width + 1));
        for (int64_t i = 0; bt && i < batch * width; ++i) bt[i] = -1;
        for (int32_t i = 0; bt && i < batch; ++i) {
            PyObject *r = PySequence_GetItem(rows, i);
            i32arr row;
            int rc = i32_get(r, &row, "block_table row");
            Py_DECREF(r);
            if (rc < 0) {
                Py_DECREF(rows);
                goto done;
            }
            memcpy(bt + i * width, row.p, sizeof(int32_t) * (size_t)row.n);
            i32_free(&row);
        }
        Py_DECREF(rows);
        if (!bt) {
            PyErr_NoMemory();
            goto done;
        }
    }
    {
        int64_t cap = batch * width;
        int32_t *indptr = malloc(sizeof(int32_t) * (size_t)(batch + 1));
        int32_t *indices = malloc(sizeof(int32_t) * (size_t)(cap + 1));
        int32_t *last = malloc(sizeof(int32_t) * (size_t)(batch + 1));
        if (!indptr || !indices || !last) {
            PyErr_NoMemory();
        } else {
            kva_status st = kva_block_table_to_csr(bt, batch, (int32_t)width, lens.p, page_size, indptr, indices,
                                                   (int32_t)cap, last);
            if (st != KVA_OK)
                raise_status(st, kva_last_error());
            else
                res = Py_BuildValue("(NNN)", list_i32(indptr, batch + 1), list_i32(indices, indptr[batch]),
                                    list_i32(last, batch));
        }
        free(indptr);
        free(indices);
        free(last);
    }
done:
    free(bt);
    i32_free(&lens);
    return res;
}

static PyObject *ext_cuda_available(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    return PyBool_FromLong(kva_cuda_available());
}

static PyObject *ext_set_num_threads(PyObject *m, PyObject *arg) {
    (void)m;
    int32_t n;
    if (arg_i32(arg, "threads", &n) < 0) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "threads must be >= 0 (0: the cores this process may run on)");
        return NULL;
    }
    cpu_threads_wanted = (int)n;
    if (cpu_slot.ctx) kva_context_set_threads(cpu_slot.ctx, (int)n);
    Py_RETURN_NONE;
}

static PyObject *ext_device_info(PyObject *m, PyObject *args) {
    (void)m;
    PyObject *dt;
    int dev_id;
    if (!PyArg_ParseTuple(args, "Oi", &dt, &dev_id)) return NULL;
    kva_device_type dev;
    if (parse_device(dt, dev_id, &dev) < 0) return NULL;
    ctx_slot *s = get_slot(dev, dev_id);
    if (!s) return NULL;
    kva_device_info i;
    kva_status st = kva_context_info(s->ctx, &i);
    if (st != KVA_OK) return raise_status(st, kva_last_error());
    return Py_BuildValue("{s:s,s:i,s:n,s:n,s:n,s:i}", "name", i.name, "num_sms", i.num_sms,
                         "l2_bytes", (Py_ssize_t)i.l2_bytes, "total_memory", (Py_ssize_t)i.total_memory,
                         "free_memory", (Py_ssize_t)i.free_memory, "threads", kva_context_threads(s->ctx));
}

/* array_info(x) -> (device_type, device_id, dtype name, shape): how kvattn sees an array. */
static PyObject *ext_array_info(PyObject *m, PyObject *arg) {
    (void)m;
    call_state cs = {0};
    view v;
    if (view_get(arg, &v, &cs, "array") < 0) return NULL;
    PyObject *shape = PyTuple_New(v.ndim), *strides = PyTuple_New(v.ndim);
    for (int i = 0; shape && strides && i < v.ndim; ++i) {
        PyTuple_SetItem(shape, i, PyLong_FromLongLong(v.shape[i]));
        PyTuple_SetItem(strides, i, PyLong_FromLongLong(v.strides[i]));
    }
    view_release(&v);
    return Py_BuildValue("(iisNN)", (int)v.dev, v.dev_id, el_name(v.el), shape, strides);
}

/* alibi_slopes(n) -> [float] (kva_alibi_slopes) */
static PyObject *ext_alibi_slopes(PyObject *m, PyObject *arg) {
    (void)m;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > 65536) {
        PyErr_SetString(PyExc_ValueError, "alibi_slopes: num_heads must be in 1..65536");
        return NULL;
    }
    float *sl = malloc(sizeof(float) * (size_t)n);
    if (!sl) return PyErr_NoMemory();
    kva_alibi_slopes((int32_t)n, sl);
    PyObject *l = PyList_New(n);
    for (long i = 0; l && i < n; ++i) {
        PyObject *x = PyFloat_FromDouble(sl[i]);
        if (!x) {
            Py_CLEAR(l);
            break;
        }
        PyList_SetItem(l, i, x);
    }
    free(sl);
    return l;
}

static PyObject *ext_alibi_source(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    const char *src = kva_variant_alibi_source();
    if (!src) Py_RETURN_NONE;
    return PyUnicode_FromString(src);
}

static PyMethodDef ext_methods[] = {
    {"merge_states", (PyCFunction)(void (*)(void))ext_merge_states, METH_VARARGS | METH_KEYWORDS, NULL},
    {"attention", (PyCFunction)(void (*)(void))ext_attention, METH_VARARGS | METH_KEYWORDS, NULL},
    {"block_table_to_csr", ext_block_table_to_csr, METH_VARARGS, NULL},
    {"cuda_available", ext_cuda_available, METH_NOARGS, NULL},
    {"set_num_threads", ext_set_num_threads, METH_O, NULL},
    {"device_info", ext_device_info, METH_VARARGS, NULL},
    {"array_info", ext_array_info, METH_O, NULL},
    {"alibi_slopes", ext_alibi_slopes, METH_O, NULL},
    {"alibi_source", ext_alibi_source, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef ext_module = {PyModuleDef_HEAD_INIT, "_ext",
                                        "kvattn's C binding (stable ABI). Use the kvattn package.", -1,
                                        ext_methods, NULL, NULL, NULL, NULL};

#define INTERN(var, text)                                  \
    do {                                                   \
        if (!((var) = PyUnicode_InternFromString(text))) return NULL; \
    } while (0)

PyMODINIT_FUNC PyInit__ext(void) {
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_dtype, "dtype");
    INTERN(s_shape, "shape");
    INTERN(s_stride, "stride");
    INTERN(s_get_device, "get_device");
    INTERN(s_dlpack, "__dlpack__");
    INTERN(s_dlpack_device, "__dlpack_device__");
    INTERN(s_stream, "stream");
    INTERN(s_max_version, "max_version");
    INTERN(s_cupy, "cupy");
    if (!(empty_tuple = PyTuple_New(0))) return NULL;
    if (!(max_version_1_0 = Py_BuildValue("(ii)", 1, 0))) return NULL;
    if (!(legacy_types = PySet_New(NULL))) return NULL;

    PyObject *m = PyModule_Create(&ext_module);
    if (!m) return NULL;
    Error = PyErr_NewExceptionWithDoc("kvattn.KvattnError",
                                      "A kvattn library call failed. Attributes: status (int, kva_status), "
                                      "status_name ('KVA_ERR_...'), message (what was wrong).",
                                      PyExc_RuntimeError, NULL);
    if (!Error) return NULL;
    NoSpaceError = PyErr_NewExceptionWithDoc("kvattn.NoSpaceError",
                                             "The cache has too few free pages or sequence slots "
                                             "(KVA_ERR_NO_SPACE); nothing was changed.",
                                             Error, NULL);
    if (!NoSpaceError) return NULL;
    Py_INCREF(Error);
    Py_INCREF(NoSpaceError);
    PyModule_AddObject(m, "KvattnError", Error);
    PyModule_AddObject(m, "NoSpaceError", NoSpaceError);

    KVPagesType = (PyTypeObject *)PyType_FromSpec(&kvpages_spec);
    CacheType = (PyTypeObject *)PyType_FromSpec(&cache_spec);
    WorkspaceType = (PyTypeObject *)PyType_FromSpec(&workspace_spec);
    PoolViewType = (PyTypeObject *)PyType_FromSpec(&poolview_spec);
    VariantType = (PyTypeObject *)PyType_FromSpec(&variant_spec);
    if (!KVPagesType || !CacheType || !WorkspaceType || !PoolViewType || !VariantType) return NULL;
    Py_INCREF(KVPagesType);
    Py_INCREF(CacheType);
    Py_INCREF(WorkspaceType);
    PyModule_AddObject(m, "KVPages", (PyObject *)KVPagesType);
    PyModule_AddObject(m, "Cache", (PyObject *)CacheType);
    PyModule_AddObject(m, "Workspace", (PyObject *)WorkspaceType);
    Py_INCREF(VariantType);
    PyModule_AddObject(m, "Variant", (PyObject *)VariantType);
    PyModule_AddIntConstant(m, "VARIANT_DECODE", KVA_VARIANT_DECODE);
    PyModule_AddIntConstant(m, "VARIANT_PREFILL", KVA_VARIANT_PREFILL);
    PyModule_AddIntConstant(m, "DEVICE_CPU", KVA_DEVICE_CPU);
    PyModule_AddIntConstant(m, "DEVICE_CUDA", KVA_DEVICE_CUDA);
    PyModule_AddIntConstant(m, "F32", KVA_F32);
    PyModule_AddIntConstant(m, "F16", KVA_F16);
    PyModule_AddIntConstant(m, "BF16", KVA_BF16);
    PyModule_AddIntConstant(m, "WS_DECODE", WS_DECODE);
    PyModule_AddIntConstant(m, "WS_PREFILL", WS_PREFILL);
    PyModule_AddStringConstant(m, "__version__", "0.1.0");
#ifdef KVA_HAVE_CUDA
    PyModule_AddIntConstant(m, "built_with_cuda", 1);
#else
    PyModule_AddIntConstant(m, "built_with_cuda", 0);
#endif
    return m;
}
