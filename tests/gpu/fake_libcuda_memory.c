/* Host-memory device memory, streams and events for the fake libcuda (compiled together with
 * fake_libcuda.c into one libcuda.so.1): cuMemAlloc is malloc, copies are memcpy, and an event
 * records the host's monotonic clock, so cuEventElapsedTime measures host time. The fake driver
 * runs no kernels, so a stream is idle unless the fake NCCL, in its asynchronous mode, has
 * operations pending: its fake_nccl_pending() is found in the already loaded library named by
 * TRIDENT_NCCL or TRIDENT_RCCL (dlopen with RTLD_NOLOAD), and queries say CUDA_ERROR_NOT_READY
 * while it is non-zero; synchronizing waits for it, forever if need be, as CUDA does. The symbols
 * are weak: a fuller emulating driver that defines them wins when linked in with this file.
 *
 * A host-to-device copy returns before its bytes land, as cuMemcpyHtoD from pageable memory does
 * on a GPU (it returns once the bytes are staged; the DMA completes in the order of the legacy
 * default stream). The fake keeps such copies pending and lands them, in order, when the legacy
 * default stream is next synchronized or used: cuCtxSynchronize, cuStreamSynchronize or
 * cuEventRecord on the NULL stream, a copy to the host, a free. Work ordered only after another
 * stream (the NCCL stream waiting on a non-blocking stream's event) reads what was there before:
 * on an H100 `check nccl` read a receive buffer's fill pattern that landed after the collective.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
struct fake_event { double ms; int recorded; };

#define WEAK __attribute__((weak))

WEAK CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *pointer = (CUdeviceptr)(uintptr_t)p;
    return 0;
}
/* Host-to-device copies staged but not landed, oldest first. */
struct staged { void *to; void *bytes; size_t n; struct staged *next; };
static struct staged *staged_head, *staged_tail;
static pthread_mutex_t staged_lock = PTHREAD_MUTEX_INITIALIZER;

/* The legacy default stream reaches this point: every staged copy lands, in order. */
static void land_staged(void) {
    pthread_mutex_lock(&staged_lock);
    while (staged_head) {
        struct staged *s = staged_head;
        memcpy(s->to, s->bytes, s->n);
        staged_head = s->next;
        free(s->bytes);
        free(s);
    }
    staged_tail = NULL;
    pthread_mutex_unlock(&staged_lock);
}

WEAK CUresult cuMemFree_v2(CUdeviceptr pointer) {
    land_staged();
    free((void *)(uintptr_t)pointer);
    return 0;
}
WEAK CUresult cuMemcpyHtoD_v2(CUdeviceptr to, const void *from, size_t bytes) {
    struct staged *s = malloc(sizeof *s);
    void *copy = malloc(bytes ? bytes : 1);
    if (!s || !copy) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    memcpy(copy, from, bytes);
    *s = (struct staged){(void *)(uintptr_t)to, copy, bytes, NULL};
    pthread_mutex_lock(&staged_lock);
    if (staged_tail) staged_tail->next = s; else staged_head = s;
    staged_tail = s;
    pthread_mutex_unlock(&staged_lock);
    return 0;
}
WEAK CUresult cuMemcpyDtoH_v2(void *to, CUdeviceptr from, size_t bytes) {
    land_staged();
    memcpy(to, (const void *)(uintptr_t)from, bytes);
    return 0;
}

/* Operations the fake NCCL has not finished (0 without it, or in its synchronous mode). */
static int nccl_pending(void) {
    static int (*pending)(void);
    if (!pending) {
        const char *vars[] = {"TRIDENT_NCCL", "TRIDENT_RCCL"};
        for (int i = 0; i < 2 && !pending; i++) {
            const char *path = getenv(vars[i]);
            void *h = path ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
            if (h) pending = (int (*)(void))dlsym(h, "fake_nccl_pending");
        }
        if (!pending) return 0;
    }
    return pending();
}
static void wait_idle(void) {
    while (nccl_pending()) sched_yield();
}

WEAK CUresult cuCtxSynchronize(void) { land_staged(); wait_idle(); return 0; }

static int stream_token;
WEAK CUresult cuStreamCreate(void **stream, unsigned flags) { (void)flags; *stream = &stream_token; return 0; }
WEAK CUresult cuStreamDestroy_v2(void *stream) { (void)stream; return 0; }
WEAK CUresult cuStreamSynchronize(void *stream) {
    if (!stream) land_staged();
    wait_idle();
    return 0;
}
WEAK CUresult cuStreamQuery(void *stream) { (void)stream; return nccl_pending() ? 600 : 0; }
WEAK CUresult cuStreamWaitEvent(void *stream, void *event, unsigned flags) {
    (void)stream;
    return event && flags == 0 ? 0 : 1;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
WEAK CUresult cuEventCreate(void **event, unsigned flags) {
    (void)flags;
    *event = calloc(1, sizeof(struct fake_event));
    return *event ? 0 : 2;
}
WEAK CUresult cuEventRecord(void *event, void *stream) {
    if (!stream) land_staged(); /* the event completes after the legacy stream's copies */
    struct fake_event *e = event;
    e->ms = now_ms();
    e->recorded = 1;
    return 0;
}
WEAK CUresult cuEventQuery(void *event) { (void)event; return nccl_pending() ? 600 : 0; }
WEAK CUresult cuEventSynchronize(void *event) { (void)event; wait_idle(); return 0; }
WEAK CUresult cuEventElapsedTime(float *ms, void *start, void *end) {
    struct fake_event *a = start, *b = end;
    if (!a->recorded || !b->recorded) return 400; /* CUDA_ERROR_INVALID_HANDLE */
    *ms = (float)(b->ms - a->ms);
    return 0;
}
WEAK CUresult cuEventDestroy_v2(void *event) { free(event); return 0; }
