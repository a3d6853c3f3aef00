/*
 * variant_cache.c -- the disk cache of compiled variant modules (variant.h).
 *
 * One file per module, <dir>/<key>.kvamod, the key a 128-bit hash of everything the code depends
 * on (kva__variant_key). Layout, little-endian as written by this machine:
 *     "KVAVAR02" | key[2] u64 | payload bytes u64 | payload FNV-1a u64 | payload
 *     payload = is_ptx u32 | per kernel slot (five; "KVAVAR01" files had four): name length u32
 *               (0 = none) + name | code size u64 + code
 * A file is trusted only if its magic, key (a stale file under a colliding or reused name) and
 * checksum (a truncated or corrupted one) all match and its payload parses exactly; anything
 * else is a miss and the caller recompiles and overwrites it. Writes go to a temporary file in
 * the same directory and are renamed into place, so concurrent processes see either the old
 * file or the whole new one.
 */
#include "variant.h"
#include "../common/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAGIC "KVAVAR02" /* (02: five kernel slots) */
#define HEADER_BYTES (8 + 4 * 8)
#define MAX_PAYLOAD ((uint64_t)1 << 30)

uint64_t kva__fnv1a64(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void kva__vcache_path(const char *dir, const uint64_t key[2], char *buf, size_t size) {
    snprintf(buf, size, "%s/%016llx%016llx.kvamod", dir, (unsigned long long)key[0],
             (unsigned long long)key[1]);
}

/* mkdir -p of dir (mode 0700: the cache holds code this user's processes will run). */
static int make_dirs(const char *dir) {
    char tmp[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, dir, n + 1);
    for (size_t i = 1; i <= n; ++i) {
        if (tmp[i] == '/' || tmp[i] == '\0') {
            const char c = tmp[i];
            tmp[i] = '\0';
            if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
            tmp[i] = c;
        }
    }
    return 0;
}

bool kva__variant_cache_dir(char *buf, size_t size) {
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') {
        snprintf(buf, size, "%s/kvattn", xdg);
        return true;
    }
    const char *home = getenv("HOME");
    if (home && home[0] == '/') {
        snprintf(buf, size, "%s/.cache/kvattn", home);
        return true;
    }
    return false;
}

static void put_u32(unsigned char **p, uint32_t v) { memcpy(*p, &v, 4); *p += 4; }
static void put_u64(unsigned char **p, uint64_t v) { memcpy(*p, &v, 8); *p += 8; }

/* Reads from [*p, end); false past the end. */
static bool get_u32(const unsigned char **p, const unsigned char *end, uint32_t *v) {
    if ((size_t)(end - *p) < 4) return false;
    memcpy(v, *p, 4);
    *p += 4;
    return true;
}
static bool get_u64(const unsigned char **p, const unsigned char *end, uint64_t *v) {
    if ((size_t)(end - *p) < 8) return false;
    memcpy(v, *p, 8);
    *p += 8;
    return true;
}

static void free_image_parts(kva__vmod_image *img) {
    free(img->code);
    img->code = NULL;
    img->code_size = 0;
    for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i) {
        free(img->names[i]);
        img->names[i] = NULL;
    }
}

/* Parses a payload into img; false (img left without parts) if it is not exactly one. */
static bool parse_payload(const unsigned char *p, const unsigned char *end, kva__vmod_image *img) {
    uint32_t is_ptx = 0;
    if (!get_u32(&p, end, &is_ptx) || is_ptx > 1) return false;
    for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i) {
        uint32_t len = 0;
        if (!get_u32(&p, end, &len)) goto bad;
        if (len == 0) continue;
        if (len > 4096 || (size_t)(end - p) < len) goto bad;
        img->names[i] = (char *)malloc(len + 1);
        if (!img->names[i]) goto bad;
        memcpy(img->names[i], p, len);
        img->names[i][len] = '\0';
        if (strlen(img->names[i]) != len) goto bad;
        p += len;
    }
    uint64_t size = 0;
    if (!get_u64(&p, end, &size) || size == 0 || size != (uint64_t)(end - p)) goto bad;
    img->code = (unsigned char *)malloc((size_t)size + 1);
    if (!img->code) goto bad;
    memcpy(img->code, p, (size_t)size);
    img->code[size] = 0; /* PTX is loaded as a NUL-terminated string */
    img->code_size = (size_t)size;
    img->is_ptx = (int)is_ptx;
    if (img->is_ptx && strlen((const char *)img->code) != img->code_size) goto bad;
    return true;
bad:
    free_image_parts(img);
    return false;
}

int kva__vcache_load(const char *dir, kva__vmod_image *img) {
    char path[4200];
    kva__vcache_path(dir, img->key, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char head[HEADER_BYTES];
    unsigned char *buf = NULL;
    int ok = 0;
    if (fread(head, 1, sizeof head, f) == sizeof head && memcmp(head, MAGIC, 8) == 0) {
        const unsigned char *h = head + 8, *he = head + sizeof head;
        uint64_t k0 = 0, k1 = 0, size = 0, sum = 0;
        get_u64(&h, he, &k0);
        get_u64(&h, he, &k1);
        get_u64(&h, he, &size);
        get_u64(&h, he, &sum);
        if (k0 == img->key[0] && k1 == img->key[1] && size > 0 && size <= MAX_PAYLOAD &&
            (buf = (unsigned char *)malloc((size_t)size + 1)) != NULL &&
            fread(buf, 1, (size_t)size, f) == (size_t)size && fgetc(f) == EOF &&
            kva__fnv1a64(0xcbf29ce484222325ull, buf, (size_t)size) == sum)
            ok = parse_payload(buf, buf + size, img);
    }
    free(buf);
    fclose(f);
    if (ok) img->from_disk = 1;
    return ok;
}

int kva__vcache_store(const char *dir, const kva__vmod_image *img) {
    if (make_dirs(dir) != 0) return -1;
    size_t payload = 4 + 8 + img->code_size;
    for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i) payload += 4 + (img->names[i] ? strlen(img->names[i]) : 0);
    unsigned char *buf = (unsigned char *)malloc(HEADER_BYTES + payload);
    if (!buf) return -1;
    unsigned char *p = buf + HEADER_BYTES;
    put_u32(&p, (uint32_t)img->is_ptx);
    for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i) {
        const uint32_t len = img->names[i] ? (uint32_t)strlen(img->names[i]) : 0;
        put_u32(&p, len);
        if (len) { memcpy(p, img->names[i], len); p += len; }
    }
    put_u64(&p, (uint64_t)img->code_size);
    memcpy(p, img->code, img->code_size);
    unsigned char *h = buf;
    memcpy(h, MAGIC, 8);
    h += 8;
    put_u64(&h, img->key[0]);
    put_u64(&h, img->key[1]);
    put_u64(&h, (uint64_t)payload);
    put_u64(&h, kva__fnv1a64(0xcbf29ce484222325ull, buf + HEADER_BYTES, payload));

    static int counter; /* distinct temporary names for threads of one process */
    char path[4200], tmp[4300];
    kva__vcache_path(dir, img->key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%d", path, (long)getpid(),
             __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    int rc = -1;
    FILE *f = fopen(tmp, "wb");
    if (f) {
        const bool written = fwrite(buf, 1, HEADER_BYTES + payload, f) == HEADER_BYTES + payload;
        if (fclose(f) == 0 && written && rename(tmp, path) == 0) rc = 0;
        else remove(tmp);
    }
    free(buf);
    return rc;
}
