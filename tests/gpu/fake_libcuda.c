/* A stand-in for libcuda.so.1 on machines without an NVIDIA driver, so that the tests can drive
 * trident's driver table through a real dlopen: two devices that look like A100s, a driver that
 * reports CUDA 12.4, and a cuModuleLoadData that refuses (it cannot run kernels). Environment:
 * FAKE_CUDA_INIT_FAIL=1 makes cuInit return CUDA_ERROR_NO_DEVICE. Built with -DFAKE_CUDA_NO_ATTRIBUTE,
 * it lacks cuDeviceGetAttribute (a library older than trident needs). */
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

typedef int CUresult;

CUresult cuInit(unsigned flags) { (void)flags; return getenv("FAKE_CUDA_INIT_FAIL") ? 100 : 0; }
CUresult cuDriverGetVersion(int *v) { *v = 12040; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 2; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal > 1) return 101; *d = ordinal; return 0; }
CUresult cuDeviceGetName(char *name, int len, int d) { (void)d; strncpy(name, "Fake A100-SXM4-40GB", (size_t)len); return 0; }
#ifndef FAKE_CUDA_NO_ATTRIBUTE
CUresult cuDeviceGetAttribute(int *v, int attribute, int d) {
    (void)d;
    switch (attribute) {
    case 1: case 2: case 3: *v = 1024; return 0;   /* threads per block, block x, y */
    case 4: *v = 64; return 0;                      /* block z */
    case 5: *v = 2147483647; return 0;              /* grid x */
    case 6: case 7: *v = 65535; return 0;           /* grid y, z */
    case 8: *v = 49152; return 0;                   /* shared memory per block */
    case 10: *v = 32; return 0;                     /* warp size */
    case 16: *v = 108; return 0;                    /* SMs */
    case 75: *v = 8; return 0;                      /* compute capability */
    case 76: *v = 0; return 0;
    case 97: *v = 166912; return 0;                 /* opt-in shared memory */
    default: return 1;
    }
}
#endif
CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) { (void)d; *bytes = (size_t)40 << 30; return 0; }
CUresult cuGetErrorName(CUresult code, const char **name) {
    switch (code) {
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 801: *name = "CUDA_ERROR_NOT_SUPPORTED"; return 0;
    default: return 1;  /* unknown to the fake: trident falls back to its own table */
    }
}
CUresult cuGetErrorString(CUresult code, const char **message) {
    switch (code) {
    case 100: *message = "no CUDA-capable device is detected"; return 0;
    case 801: *message = "fake driver: cannot run kernels"; return 0;
    default: return 1;
    }
}
static int context_token;
CUresult cuDevicePrimaryCtxRetain(void **context, int d) { (void)d; *context = &context_token; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
CUresult cuCtxSetCurrent(void *context) { (void)context; return 0; }
CUresult cuModuleLoadData(void **module, const void *image) { (void)module; (void)image; return 801; }
