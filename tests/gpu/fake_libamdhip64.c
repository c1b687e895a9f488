/* A stand-in for libamdhip64.so on machines without ROCm, so that the tests can drive trident's
 * HIP table through a real dlopen: a runtime that reports HIP 6.2.41133 and two devices that look
 * like MI250X GCDs (gfx90a, 110 compute units, 64 GiB), and a hipModuleLoadData that refuses (it
 * cannot run kernels) unless FAKE_HIP_RUNS=1: then it accepts a gfx90a code object (an AMDGPU
 * ELF whose e_flags name gfx90a) that holds the smoke test's kernel, and hipModuleLaunchKernel
 * runs that kernel (y = a x + y, one thread per element, the guard i < n) on the host over the
 * grid it is given, in host memory that hipMalloc hands out. FAKE_HIP_WRONG=1 makes the launch
 * compute one element wrong (the smoke test must notice). hipGetDeviceProperties writes a struct of its own layout, not ROCm's: trident
 * must find gcnArchName by content, not by offset. Environment: FAKE_HIP_INIT_FAIL=1 makes hipInit
 * return hipErrorNoDevice. Built with -DFAKE_HIP_OLD, it lacks hipDeviceGetAttribute (a runtime
 * older than trident needs) and hipGetErrorName / hipGetErrorString, so trident names codes from
 * its own table. */
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <stdint.h>

typedef int hipError_t;

struct fake_device_prop {
    char name[256];
    size_t totalGlobalMem;
    int fields_before_the_arch[200];
    int gcnArch;
    char gcnArchName[256];
    int fields_after_the_arch[64];
};

hipError_t hipInit(unsigned flags) { (void)flags; return getenv("FAKE_HIP_INIT_FAIL") ? 100 : 0; }
hipError_t hipDriverGetVersion(int *v) { *v = 60241133; return 0; }
hipError_t hipRuntimeGetVersion(int *v) { *v = 60241133; return 0; }
hipError_t hipGetDeviceCount(int *n) { *n = 2; return 0; }
hipError_t hipDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal > 1) return 101; *d = ordinal; return 0; }
hipError_t hipDeviceGetName(char *name, int len, int d) { (void)d; strncpy(name, "AMD Instinct MI250X", (size_t)len); return 0; }
hipError_t hipDeviceTotalMem(size_t *bytes, int d) { (void)d; *bytes = (size_t)64 << 30; return 0; }
#ifndef FAKE_HIP_OLD
hipError_t hipDeviceGetAttribute(int *v, int attribute, int d) {
    (void)d;
    switch (attribute) {
    case 56: *v = 1024; return 0; /* max threads per block */
    case 63: *v = 110; return 0;  /* compute units */
    case 87: *v = 64; return 0;   /* wavefront size */
    default: return 1;            /* hipErrorInvalidValue */
    }
}
const char *hipGetErrorName(hipError_t code) {
    switch (code) {
    case 100: return "hipErrorNoDevice";
    case 209: return "hipErrorNoBinaryForGpu";
    case 500: return "hipErrorNotFound";
    case 801: return "hipErrorNotSupported";
    default: return "hipErrorUnknown";
    }
}
const char *hipGetErrorString(hipError_t code) {
    switch (code) {
    case 100: return "no ROCm-capable device is detected";
    case 209: return "fake HIP runtime: not a gfx90a code object";
    case 500: return "fake HIP runtime: no such kernel in the module";
    case 801: return "fake HIP runtime: cannot run kernels";
    default: return "unknown error";
    }
}
#endif
hipError_t hipGetDeviceProperties(void *out, int d) {
    struct fake_device_prop p;
    if (d < 0 || d > 1) return 101;
    memset(&p, 0, sizeof p);
    strcpy(p.name, "AMD Instinct MI250X");
    p.totalGlobalMem = (size_t)64 << 30;
    p.fields_before_the_arch[7] = 110;
    p.gcnArch = 910;
    strcpy(p.gcnArchName, "gfx90a:sramecc+:xnack-");
    memcpy(out, &p, sizeof p);
    return 0;
}
static int module_token, function_token;
static const char kernel_name[] = "trident_smoke_axpy";

/* Whether the n bytes at p contain the C string s. */
static int contains(const unsigned char *p, size_t n, const char *s) {
    size_t k = strlen(s);
    for (size_t i = 0; i + k <= n; ++i)
        if (memcmp(p + i, s, k) == 0) return 1;
    return 0;
}

hipError_t hipSetDevice(int d) { return (d < 0 || d > 1) ? 101 : 0; }
hipError_t hipModuleLoadData(void **module, const void *image) {
    const unsigned char *elf = image;
    uint16_t machine;
    uint32_t flags;
    if (!getenv("FAKE_HIP_RUNS")) return 801;
    if (memcmp(elf, "\x7f" "ELF", 4) != 0) return 209;
    memcpy(&machine, elf + 0x12, 2);
    memcpy(&flags, elf + 0x30, 4);
    if (machine != 0xe0 || (flags & 0xff) != 0x3f) return 209; /* EM_AMDGPU, EF_AMDGPU_MACH gfx90a */
    /* The kernel's name is in the string table; scan the first 64 KiB (a small code object). */
    if (!contains(elf, 1 << 16, kernel_name)) return 500;
    *module = &module_token;
    return 0;
}
hipError_t hipModuleUnload(void *module) { return module == &module_token ? 0 : 400; }
hipError_t hipModuleGetFunction(void **function, void *module, const char *name) {
    if (module != &module_token) return 400;
    if (strcmp(name, kernel_name) != 0) return 500;
    *function = &function_token;
    return 0;
}
hipError_t hipModuleLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    (void)shared; (void)stream; (void)extra;
    if (function != &function_token || gy != 1 || gz != 1 || by != 1 || bz != 1 || bx > 1024) return 1;
    float a = *(float *)params[0];
    const float *x = *(const float **)params[1];
    float *y = *(float **)params[2];
    unsigned long long n = *(unsigned long long *)params[3];
    for (unsigned long long i = 0; i < (unsigned long long)gx * bx; ++i)
        if (i < n) y[i] = a * x[i] + y[i];
    if (getenv("FAKE_HIP_WRONG") && n > 0) y[n - 1] += 1.0f;
    return 0;
}
hipError_t hipDeviceSynchronize(void) { return 0; }
hipError_t hipMalloc(void **p, size_t bytes) { *p = malloc(bytes); return *p ? 0 : 2; }
hipError_t hipFree(void *p) { free(p); return 0; }
hipError_t hipMemcpyHtoD(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); return 0; }
hipError_t hipMemcpyDtoH(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); return 0; }
