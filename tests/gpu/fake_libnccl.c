/* A stand-in for libnccl.so.2 / librccl.so on machines without GPUs, so that tests can drive
 * trident's NCCL Comm (src/gpu/collectives.rs) through a real dlopen, with ranks that are MPI
 * processes started by mpirun. "Device pointers" are host pointers: the fake libcuda
 * (fake_libcuda_memory.c) keeps device memory in host memory.
 *
 * How ranks meet: ncclGetUniqueId fills 128 random bytes; ncclCommInitRank maps the POSIX shared
 * memory segment named from the first 12 of them, which holds, per rank, an arrival counter and
 * its pid, a slot of SLOT_BYTES for collectives, and a channel of P2P_BYTES for every ordered
 * pair of ranks. A collective runs in rounds of at most a slot per rank: every rank writes its
 * part into its slot, all meet at a barrier, every rank computes its result from all slots (sums
 * in fixed rank order 0, 1, ..., n-1, in f32 for bf16 and f16, rounded once to nearest even), and all
 * meet again before the slots are reused. Barriers spin with sched_yield and give up after
 * FAKE_NCCL_TIMEOUT_SECS (default 60) or as soon as a peer's pid is gone, returning
 * ncclRemoteError with a message for ncclGetLastError, and leaving it as the communicator's
 * asynchronous error. Sends and receives between ncclGroupStart and ncclGroupEnd are queued and
 * progressed together at ncclGroupEnd (one message in flight per ordered pair, in order per peer),
 * so a ring of grouped send+recv cannot deadlock. Calls are synchronous: when one returns, its
 * result is in place, and every stream is idle (unless FAKE_NCCL_ASYNC is set, below).
 *
 * Failure injection for the tests: FAKE_NCCL_FAIL_RANK=r makes rank r of every communicator (or
 * FAKE_NCCL_FAIL_PROCESS=r: every communicator of the process whose OMPI_COMM_WORLD_RANK is r),
 * at its FAKE_NCCL_FAIL_AT-th collective or send/recv group (default 1), either exit the process
 * (FAKE_NCCL_FAIL_MODE=exit) or stop taking part forever (vanish, the default: a peer whose node
 * died without its launcher noticing).
 * FAKE_NCCL_CORRUPT_RANK=r flips one bit of the last element
 * every ncclAllGather leaves on rank r (a wrong result the comparison against MPI must catch).
 *
 * FAKE_NCCL_LOG=path appends one line per collective or send/recv group a rank submits ("<op>
 * <elements> <rank of the communicator>/<ranks>", then for a collective its element type and, for
 * a reduction, its operation: "all_reduce 32 0/2 f64 max"), so tests can prove that tensors (and
 * the cross-entropy's f64 statistics) took this path.
 *
 * EMU_STREAM_LOG=path (shared with the emulated libcuda, tests/gpu/emu_runtime.h) appends
 * "<pid> nccl <op> <stream>" per submitted operation, so a test sees which stream each runs on
 * beside the driver's launches, event records and stream waits.
 *
 * FAKE_NCCL_ASYNC=1 makes calls asynchronous, as NCCL's are: each communicator runs its operations
 * in order on a worker thread (its "stream"), a failure becomes the communicator's asynchronous
 * error, and the exported fake_nccl_pending() counts operations not yet finished, which the fake
 * libcuda's stream and event queries consult (a stream is busy while any is pending).
 * ncclCommAbort stops a worker stuck in a barrier. Event timings mean nothing in this mode.
 * fake_nccl_stream_progress(stream, &submitted, &finished) counts the operations submitted on one
 * stream and those finished, so an emulating libcuda can give that stream's events and queries
 * their real meaning (tests/gpu/emu_libcuda.cpp).
 *
 * FAKE_NCCL_P2P_CHUNK=bytes (at most the channel's 256 KiB) moves point-to-point messages in
 * pieces of that size: a send larger than one piece then finishes only once its receiver has
 * taken all but the last, as a real NCCL send of a large message waits for its receive.
 *
 * FAKE_NCCL_P2P_LATE=n (asynchronous mode) keeps a communicator's stream busy 20 ms after each of
 * its point-to-point groups with a send, from its n-th operation on, as a send on a loaded node
 * finishes late: whoever reuses a sent buffer only once its stream looks idle sees a different
 * answer from that operation on.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclSystemError = 2, ncclInternalError = 3, ncclInvalidArgument = 4,
       ncclInvalidUsage = 5, ncclRemoteError = 6 };
enum { ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64, ncclFloat16, ncclFloat32,
       ncclFloat64, ncclBfloat16 };
enum { ncclSum, ncclProd, ncclMax, ncclMin };

#define MAX_RANKS 64
#define SLOT_BYTES (1u << 20)
#define P2P_BYTES (256u << 10)

typedef struct { char internal[128]; } ncclUniqueId;

struct rank_state {
    uint64_t arrived; /* barriers passed into, monotonic */
    int32_t pid;
    int32_t pad;
};
struct channel {
    uint64_t sent;  /* messages the sender has put, monotonic */
    uint64_t taken; /* messages the receiver has taken */
    uint64_t bytes; /* size of the message in data */
    uint64_t pad;
    char data[P2P_BYTES];
};
struct segment {
    struct rank_state ranks[MAX_RANKS];
    /* then nranks slots of SLOT_BYTES, then nranks * nranks channels */
};

struct job;
struct fake_comm {
    int rank, nranks;
    char name[64];
    struct segment *seg;
    size_t bytes;
    uint64_t barriers; /* barriers this rank has entered */
    uint64_t ops;      /* collectives and groups issued, for failure injection */
    volatile ncclResult_t async_error;
    /* FAKE_NCCL_ASYNC: the worker thread and its queue of jobs. */
    int has_worker, stopping;
    volatile int aborted;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *head, *tail;
};
static int pending_total; /* operations enqueued and not finished, over all communicators */
int fake_nccl_pending(void) { return __atomic_load_n(&pending_total, __ATOMIC_ACQUIRE); }
typedef struct fake_comm *ncclComm_t;

static char last_error[512];
static double timeout_secs(void) {
    const char *s = getenv("FAKE_NCCL_TIMEOUT_SECS");
    return s ? atof(s) : 60.0;
}
static ncclResult_t fail(struct fake_comm *c, ncclResult_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (c && code == ncclRemoteError) c->async_error = code;
    return code;
}
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static char *slot(struct fake_comm *c, int r) {
    return (char *)c->seg + sizeof(struct segment) + (size_t)r * SLOT_BYTES;
}
static struct channel *chan(struct fake_comm *c, int from, int to) {
    struct channel *first = (struct channel *)(slot(c, c->nranks));
    return first + (size_t)from * c->nranks + to;
}
static int peer_gone(struct fake_comm *c, int r) {
    int pid = __atomic_load_n(&c->seg->ranks[r].pid, __ATOMIC_ACQUIRE);
    return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

/* Failure injection: called at the start of every collective and group. */
static void maybe_fail(struct fake_comm *c) {
    c->ops++;
    const char *r = getenv("FAKE_NCCL_FAIL_RANK");
    const char *process = getenv("FAKE_NCCL_FAIL_PROCESS");
    const char *world = getenv("OMPI_COMM_WORLD_RANK");
    int chosen = process ? world && atoi(process) == atoi(world) : r && atoi(r) == c->rank;
    if (!chosen) return;
    const char *at = getenv("FAKE_NCCL_FAIL_AT");
    if (c->ops != (uint64_t)(at ? atoll(at) : 1)) return;
    const char *mode = getenv("FAKE_NCCL_FAIL_MODE");
    if (mode && strcmp(mode, "exit") == 0) _exit(0);
    for (;;) pause();
}

static ncclResult_t barrier(struct fake_comm *c, const char *what) {
    uint64_t gen = ++c->barriers;
    __atomic_store_n(&c->seg->ranks[c->rank].arrived, gen, __ATOMIC_RELEASE);
    double start = now(), limit = timeout_secs();
    for (unsigned spin = 0;; spin++) {
        int missing = -1;
        for (int r = 0; r < c->nranks; r++)
            if (__atomic_load_n(&c->seg->ranks[r].arrived, __ATOMIC_ACQUIRE) < gen) { missing = r; break; }
        if (missing < 0) return ncclSuccess;
        if ((spin & 255) == 255) {
            if (c->aborted) return fail(c, ncclRemoteError, "fake NCCL: %s aborted by ncclCommAbort", what);
            if (peer_gone(c, missing))
                return fail(c, ncclRemoteError, "fake NCCL: rank %d (pid %d) exited before %s on rank %d", missing,
                            c->seg->ranks[missing].pid, what, c->rank);
            if (now() - start > limit)
                return fail(c, ncclRemoteError, "fake NCCL: rank %d did not arrive at %s within %.0f s (rank %d waited)",
                            missing, what, limit, c->rank);
        }
        sched_yield();
    }
}

static size_t type_bytes(int t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}
static float bf16_to_f32(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
/* IEEE binary16: exact widening; narrowing rounds to nearest even, to infinity from 65520 on, to
 * multiples of 2^-24 below 2^-14 (the subnormals). */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff, u;
    if (exponent == 31) u = sign | 0x7f800000u | (mantissa << 13);
    else if (exponent != 0) u = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else {
        float f = (float)mantissa / 16777216.0f;
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;  /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00; /* from 65520 on: infinity */
    if (a < 0x38800000u) { /* below 2^-14: a whole number of 2^-24, or zero */
        if (a <= 0x33000000u) return sign; /* at most 2^-25: zero (2^-25 itself a tie, to the even 0) */
        uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - (a >> 23);
        uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        return sign | (uint16_t)(q + (rest > half || (rest == half && (q & 1))));
    }
    uint32_t rounded = a + 0xfffu + ((a >> 13) & 1); /* ties to even on the 13 dropped bits */
    return sign | (uint16_t)(((rounded >> 23) - 112) << 10 | ((rounded >> 13) & 0x3ff));
}
static float half_to_f32(int t, uint16_t b) { return t == ncclFloat16 ? f16_to_f32(b) : bf16_to_f32(b); }
static uint16_t f32_to_half(int t, float f) { return t == ncclFloat16 ? f32_to_f16(f) : f32_to_bf16(f); }
static int reducible(int t, int op) {
    return (t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 || t == ncclFloat16 || t == ncclInt32) &&
           op >= ncclSum && op <= ncclMin;
}
#define COMBINE(acc, x, op) \
    ((op) == ncclSum ? (acc) + (x) : (op) == ncclProd ? (acc) * (x) : (op) == ncclMax ? ((x) > (acc) ? (x) : (acc)) : ((x) < (acc) ? (x) : (acc)))

/* out[i] = op over ranks r (in order) of src(r)[i], for n elements of type t. */
static void reduce_slots(struct fake_comm *c, void *out, size_t offset_bytes, size_t n, int t, int op) {
    for (size_t i = 0; i < n; i++) {
        if (t == ncclFloat32) {
            float acc = ((float *)(slot(c, 0) + offset_bytes))[i];
            for (int r = 1; r < c->nranks; r++) acc = COMBINE(acc, ((float *)(slot(c, r) + offset_bytes))[i], op);
            ((float *)out)[i] = acc;
        } else if (t == ncclFloat64) {
            double acc = ((double *)(slot(c, 0) + offset_bytes))[i];
            for (int r = 1; r < c->nranks; r++) acc = COMBINE(acc, ((double *)(slot(c, r) + offset_bytes))[i], op);
            ((double *)out)[i] = acc;
        } else if (t == ncclInt32) {
            int32_t acc = ((int32_t *)(slot(c, 0) + offset_bytes))[i];
            for (int r = 1; r < c->nranks; r++) acc = COMBINE(acc, ((int32_t *)(slot(c, r) + offset_bytes))[i], op);
            ((int32_t *)out)[i] = acc;
        } else {
            float acc = half_to_f32(t, ((uint16_t *)(slot(c, 0) + offset_bytes))[i]);
            for (int r = 1; r < c->nranks; r++)
                acc = COMBINE(acc, half_to_f32(t, ((uint16_t *)(slot(c, r) + offset_bytes))[i]), op);
            ((uint16_t *)out)[i] = f32_to_half(t, acc);
        }
    }
}

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = 23299;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    size_t got = 0;
    while (got < sizeof id->internal) {
        ssize_t n = getrandom(id->internal + got, sizeof id->internal - got, 0);
        if (n < 0) return fail(NULL, ncclSystemError, "fake NCCL: getrandom failed");
        got += (size_t)n;
    }
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t code) {
    static const char *names[] = {"no error", "unhandled cuda error", "unhandled system error", "internal error",
                                  "invalid argument", "invalid usage",
                                  "remote process exited or there was a network error", "NCCL operation in progress",
                                  "timeout"};
    return code >= 0 && code < 9 ? names[code] : "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return last_error;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    if (!out || nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return fail(NULL, ncclInvalidArgument, "fake NCCL: rank %d of %d is not a valid communicator member", rank, nranks);
    struct fake_comm *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->rank = rank;
    c->nranks = nranks;
    int len = snprintf(c->name, sizeof c->name, "/trident-fake-nccl-");
    for (int i = 0; i < 12; i++) len += snprintf(c->name + len, sizeof c->name - (size_t)len, "%02x", (unsigned char)id.internal[i]);
    c->bytes = sizeof(struct segment) + (size_t)nranks * SLOT_BYTES + (size_t)nranks * nranks * sizeof(struct channel);
    int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)c->bytes) != 0) {
        fail(NULL, ncclSystemError, "fake NCCL: cannot create shared memory %s: %s", c->name, strerror(errno));
        if (fd >= 0) close(fd);
        free(c);
        return ncclSystemError;
    }
    c->seg = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (c->seg == MAP_FAILED) {
        free(c);
        return fail(NULL, ncclSystemError, "fake NCCL: cannot map shared memory: %s", strerror(errno));
    }
    __atomic_store_n(&c->seg->ranks[rank].pid, (int32_t)getpid(), __ATOMIC_RELEASE);
    ncclResult_t r = barrier(c, "ncclCommInitRank");
    if (rank == 0 || r != ncclSuccess) shm_unlink(c->name); /* every member has it mapped by now */
    if (r != ncclSuccess) {
        munmap(c->seg, c->bytes);
        free(c);
        return r;
    }
    *out = c;
    return ncclSuccess;
}

/* Destroy lets the worker finish what was enqueued; abort stops it where it is. */
static ncclResult_t finish(ncclComm_t c, int abort) {
    if (!c) return ncclInvalidArgument;
    if (c->has_worker) {
        pthread_mutex_lock(&c->mu);
        if (abort) c->aborted = 1;
        c->stopping = 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->worker, NULL);
    }
    munmap(c->seg, c->bytes);
    free(c);
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) { return finish(c, 0); }
ncclResult_t ncclCommAbort(ncclComm_t c) { return finish(c, 1); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *error) {
    if (!c || !error) return ncclInvalidArgument;
    *error = c->async_error;
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t c, int *count) { *count = c->nranks; return ncclSuccess; }
ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) { *rank = c->rank; return ncclSuccess; }

static ncclResult_t check_comm(struct fake_comm *c, const char *call) {
    if (!c) return fail(NULL, ncclInvalidArgument, "fake NCCL: %s on a null communicator", call);
    if (c->async_error) return fail(c, ncclInvalidUsage, "fake NCCL: %s on a communicator that has failed", call);
    return ncclSuccess;
}

/* The operation kinds the worker runs; the collectives first, in the order of their names. */
enum { JOB_ALL_REDUCE, JOB_ALL_GATHER, JOB_REDUCE_SCATTER, JOB_BROADCAST, JOB_P2P };

/* A collective in slot-sized chunks: each rank stages its part of the chunk in its slot (the
   root alone for a broadcast; for a reduce-scatter, segment d of a rank's slot holds its part
   destined for rank d), all meet, each reads what it needs from the slots, and all meet again
   before the slots are reused. `arg` is the reduction op, or the broadcast's root. */
static ncclResult_t run_collective(struct fake_comm *c, int kind, const void *send, void *recv, size_t count, int type,
                                   int arg) {
    static const char *calls[] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast"};
    const char *call = calls[kind];
    ncclResult_t r;
    size_t e = type_bytes(type), per = SLOT_BYTES / e / (kind == JOB_REDUCE_SCATTER ? (size_t)c->nranks : 1);
    for (size_t done = 0; done < count; done += per) {
        size_t n = count - done < per ? count - done : per;
        if (kind == JOB_REDUCE_SCATTER) {
            for (int d = 0; d < c->nranks; d++)
                memcpy(slot(c, c->rank) + (size_t)d * n * e, (const char *)send + ((size_t)d * count + done) * e, n * e);
        } else if (kind != JOB_BROADCAST || c->rank == arg) {
            memcpy(slot(c, c->rank), (const char *)send + done * e, n * e);
        }
        if ((r = barrier(c, call))) return r;
        if (kind == JOB_ALL_REDUCE) reduce_slots(c, (char *)recv + done * e, 0, n, type, arg);
        if (kind == JOB_REDUCE_SCATTER) reduce_slots(c, (char *)recv + done * e, (size_t)c->rank * n * e, n, type, arg);
        if (kind == JOB_BROADCAST) memcpy((char *)recv + done * e, slot(c, arg), n * e);
        if (kind == JOB_ALL_GATHER)
            for (int q = 0; q < c->nranks; q++) memcpy((char *)recv + ((size_t)q * count + done) * e, slot(c, q), n * e);
        if ((r = barrier(c, call))) return r;
    }
    const char *corrupt = getenv("FAKE_NCCL_CORRUPT_RANK");
    if (kind == JOB_ALL_GATHER && corrupt && atoi(corrupt) == c->rank && count)
        ((char *)recv)[((size_t)c->nranks * count - 1) * e] ^= 1;
    return ncclSuccess;
}

/* Point-to-point: queued inside a group, progressed together at its end. */
struct p2p {
    int is_send, peer;
    struct fake_comm *c;
    void *stream;
    char *buf;
    size_t bytes, done;
    int finished;
};
static struct p2p *queue;
static size_t queued, queue_cap;
static int group_depth;

/* Bytes per piece of a point-to-point message (FAKE_NCCL_P2P_CHUNK, default the whole channel). */
static size_t p2p_chunk(void) {
    const char *s = getenv("FAKE_NCCL_P2P_CHUNK");
    long v = s && *s ? atol(s) : 0;
    return v > 0 && (size_t)v < P2P_BYTES ? (size_t)v : P2P_BYTES;
}

/* Per-stream counts of submitted and finished operations (fake_nccl_stream_progress). */
#define MAX_STREAMS 256
static struct { void *stream; uint64_t submitted, finished; } streams[MAX_STREAMS];
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static void stream_count(void *stream, int submitted, int finished) {
    if (!stream) return;
    pthread_mutex_lock(&streams_mu);
    for (int i = 0; i < MAX_STREAMS; i++) {
        if (streams[i].stream == stream || !streams[i].stream) {
            streams[i].stream = stream;
            streams[i].submitted += (uint64_t)submitted;
            streams[i].finished += (uint64_t)finished;
            break;
        }
    }
    pthread_mutex_unlock(&streams_mu);
}
void fake_nccl_stream_progress(void *stream, uint64_t *submitted, uint64_t *finished) {
    *submitted = *finished = 0;
    pthread_mutex_lock(&streams_mu);
    for (int i = 0; i < MAX_STREAMS && streams[i].stream; i++) {
        if (streams[i].stream == stream) {
            *submitted = streams[i].submitted;
            *finished = streams[i].finished;
        }
    }
    pthread_mutex_unlock(&streams_mu);
}

static ncclResult_t run_queue(struct p2p *queue, size_t queued) {
    ncclResult_t result = ncclSuccess;
    size_t piece = p2p_chunk();
    for (size_t i = 0; i < queued; i++) queue[i].finished = queue[i].bytes == 0;
    double start = now(), limit = timeout_secs();
    for (unsigned spin = 0;; spin++) {
        int pending = 0, progressed = 0;
        for (size_t i = 0; i < queued; i++) {
            struct p2p *p = &queue[i];
            if (p->finished) continue;
            pending = 1;
            /* In order per (communicator, peer, direction): an earlier unfinished op goes first. */
            int blocked = 0;
            for (size_t j = 0; j < i; j++)
                if (!queue[j].finished && queue[j].c == p->c && queue[j].peer == p->peer && queue[j].is_send == p->is_send)
                    blocked = 1;
            if (blocked) continue;
            struct channel *ch = p->is_send ? chan(p->c, p->c->rank, p->peer) : chan(p->c, p->peer, p->c->rank);
            uint64_t sent = __atomic_load_n(&ch->sent, __ATOMIC_ACQUIRE);
            uint64_t taken = __atomic_load_n(&ch->taken, __ATOMIC_ACQUIRE);
            if (p->is_send && sent == taken) {
                size_t n = p->bytes - p->done < piece ? p->bytes - p->done : piece;
                memcpy(ch->data, p->buf + p->done, n);
                ch->bytes = n;
                __atomic_store_n(&ch->sent, sent + 1, __ATOMIC_RELEASE);
                p->done += n;
                progressed = 1;
            } else if (!p->is_send && sent > taken) {
                size_t n = ch->bytes;
                if (n > p->bytes - p->done) {
                    result = fail(p->c, ncclInvalidUsage,
                                  "fake NCCL: rank %d sent more bytes than rank %d's ncclRecv of %zu expects", p->peer,
                                  p->c->rank, p->bytes);
                    goto out;
                }
                memcpy(p->buf + p->done, ch->data, n);
                __atomic_store_n(&ch->taken, taken + 1, __ATOMIC_RELEASE);
                p->done += n;
                progressed = 1;
            }
            if (p->done == p->bytes) p->finished = 1;
        }
        if (!pending) break;
        if (progressed) { start = now(); continue; }
        if ((spin & 255) == 255) {
            for (size_t i = 0; i < queued; i++) {
                struct p2p *p = &queue[i];
                if (p->finished) continue;
                const char *what = p->is_send ? "ncclSend" : "ncclRecv";
                if (p->c->aborted) {
                    result = fail(p->c, ncclRemoteError, "fake NCCL: %s aborted by ncclCommAbort", what);
                    goto out;
                }
                if (peer_gone(p->c, p->peer)) {
                    result = fail(p->c, ncclRemoteError, "fake NCCL: rank %d exited during %s from rank %d", p->peer,
                                  what, p->c->rank);
                    goto out;
                }
                if (now() - start > limit) {
                    result = fail(p->c, ncclRemoteError, "fake NCCL: rank %d did not match rank %d's %s within %.0f s",
                                  p->peer, p->c->rank, what, limit);
                    goto out;
                }
            }
        }
        sched_yield();
    }
out:
    return result;
}

/* An operation as the worker runs it. */
struct job {
    int kind, type, op, root, late;
    void *stream;
    const void *send;
    void *recv;
    size_t count;
    struct p2p *ops;
    size_t nops;
    struct fake_comm *c;
    struct job *next;
};

static ncclResult_t run_job(struct job *j) {
    if (j->kind == JOB_P2P) return run_queue(j->ops, j->nops);
    return run_collective(j->c, j->kind, j->send, j->recv, j->count, j->type, j->kind == JOB_BROADCAST ? j->root : j->op);
}
static void free_job(struct job *j) {
    free(j->ops);
    free(j);
}

static void *worker_main(void *arg) {
    struct fake_comm *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->head && !c->stopping) pthread_cond_wait(&c->cv, &c->mu);
        struct job *j = c->head;
        if (j) {
            c->head = j->next;
            if (!c->head) c->tail = NULL;
        }
        pthread_mutex_unlock(&c->mu);
        if (!j) return NULL;
        if (!c->async_error && !c->aborted) {
            ncclResult_t r = run_job(j);
            if (r && !c->async_error) c->async_error = r;
            if (j->late) nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
        }
        stream_count(j->stream, 0, 1);
        free_job(j);
        __atomic_sub_fetch(&pending_total, 1, __ATOMIC_RELEASE);
    }
}

static int async_mode(void) {
    const char *a = getenv("FAKE_NCCL_ASYNC");
    return a && *a && strcmp(a, "0") != 0;
}

/* FAKE_NCCL_LOG: one line per submitted operation, appended whole (O_APPEND). */
static void log_job(const struct job *j) {
    const char *path = getenv("FAKE_NCCL_LOG");
    if (!path || !*path) return;
    static const char *names[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"};
    static const char *ops[] = {"sum", "prod", "max", "min"};
    char line[128];
    size_t n = j->kind == JOB_P2P ? j->nops : j->count;
    int len = snprintf(line, sizeof line, "%s %zu %d/%d", names[j->kind], n, j->c->rank, j->c->nranks);
    if (j->kind != JOB_P2P) {
        const char *type = j->type == ncclFloat64 ? "f64" : j->type == ncclFloat32 ? "f32" : j->type == ncclBfloat16 ? "bf16"
                           : j->type == ncclFloat16 ? "f16" : "other";
        len += snprintf(line + len, sizeof line - (size_t)len, " %s", type);
        if ((j->kind == JOB_ALL_REDUCE || j->kind == JOB_REDUCE_SCATTER) && j->op >= ncclSum && j->op <= ncclMin)
            len += snprintf(line + len, sizeof line - (size_t)len, " %s", ops[j->op]);
    }
    len += snprintf(line + len, sizeof line - (size_t)len, "\n");
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)len) < 0) { /* best effort */ }
    close(fd);
}

/* EMU_STREAM_LOG: the operation and the stream it runs on, one line appended whole. */
static void log_stream(const struct job *j) {
    const char *path = getenv("EMU_STREAM_LOG");
    if (!path || !*path) return;
    static const char *names[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"};
    char line[128];
    int len = snprintf(line, sizeof line, "%d nccl %s %p\n", (int)getpid(), names[j->kind], j->stream);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)len) < 0) { /* best effort */ }
    close(fd);
}

/* Runs the job now (synchronous mode) or hands it to its communicator's worker. */
static ncclResult_t submit(struct job j) {
    log_job(&j);
    log_stream(&j);
    if (!async_mode()) {
        ncclResult_t r = run_job(&j);
        free(j.ops);
        stream_count(j.stream, 1, 1);
        return r;
    }
    struct fake_comm *c = j.c;
    struct job *copy = malloc(sizeof *copy);
    if (!copy) return ncclSystemError;
    *copy = j;
    copy->next = NULL;
    pthread_mutex_lock(&c->mu);
    if (!c->has_worker) {
        if (pthread_create(&c->worker, NULL, worker_main, c) != 0) {
            pthread_mutex_unlock(&c->mu);
            free_job(copy);
            return fail(c, ncclSystemError, "fake NCCL: cannot start the worker thread");
        }
        c->has_worker = 1;
    }
    __atomic_add_fetch(&pending_total, 1, __ATOMIC_RELEASE);
    stream_count(copy->stream, 1, 0);
    if (c->tail) c->tail->next = copy; else c->head = copy;
    c->tail = copy;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, ncclComm_t c, void *stream) {
    ncclResult_t r = check_comm(c, "ncclAllReduce");
    if (r) return r;
    if (!reducible(type, op)) return fail(c, ncclInvalidArgument, "fake NCCL: ncclAllReduce of type %d with op %d", type, op);
    if (count && (!send || !recv)) return fail(c, ncclInvalidArgument, "fake NCCL: ncclAllReduce with a null buffer");
    maybe_fail(c);
    return submit((struct job){.stream = stream, .kind = JOB_ALL_REDUCE, .type = type, .op = op, .send = send, .recv = recv, .count = count, .c = c});
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, int type, ncclComm_t c, void *stream) {
    ncclResult_t r = check_comm(c, "ncclAllGather");
    if (r) return r;
    if (!type_bytes(type)) return fail(c, ncclInvalidArgument, "fake NCCL: ncclAllGather of type %d", type);
    maybe_fail(c);
    return submit((struct job){.stream = stream, .kind = JOB_ALL_GATHER, .type = type, .send = send, .recv = recv, .count = count, .c = c});
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, int type, int op, ncclComm_t c, void *stream) {
    ncclResult_t r = check_comm(c, "ncclReduceScatter");
    if (r) return r;
    if (!reducible(type, op))
        return fail(c, ncclInvalidArgument, "fake NCCL: ncclReduceScatter of type %d with op %d", type, op);
    maybe_fail(c);
    return submit((struct job){.stream = stream, .kind = JOB_REDUCE_SCATTER, .type = type, .op = op, .send = send, .recv = recv, .count = count, .c = c});
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, ncclComm_t c, void *stream) {
    ncclResult_t r = check_comm(c, "ncclBroadcast");
    if (r) return r;
    if (!type_bytes(type) || root < 0 || root >= c->nranks)
        return fail(c, ncclInvalidArgument, "fake NCCL: ncclBroadcast of type %d from root %d", type, root);
    maybe_fail(c);
    return submit((struct job){.stream = stream, .kind = JOB_BROADCAST, .type = type, .root = root, .send = send, .recv = recv, .count = count, .c = c});
}

/* Hands the queued sends and receives to their communicator as one job. */
static ncclResult_t submit_queue(void) {
    struct p2p *ops = malloc(queued * sizeof *ops);
    if (!ops) return ncclSystemError;
    memcpy(ops, queue, queued * sizeof *ops);
    struct job j = {.kind = JOB_P2P, .ops = ops, .nops = queued, .c = queue[0].c, .stream = queue[0].stream};
    queued = 0;
    maybe_fail(j.c);
    const char *late = getenv("FAKE_NCCL_P2P_LATE");
    for (size_t i = 0; i < j.nops; i++) j.late |= late && *late && ops[i].is_send && j.c->ops >= (uint64_t)atoll(late);
    return submit(j);
}

static ncclResult_t enqueue(int is_send, void *buf, size_t count, int type, int peer, struct fake_comm *c, void *stream) {
    const char *call = is_send ? "ncclSend" : "ncclRecv";
    ncclResult_t r = check_comm(c, call);
    if (r) return r;
    size_t e = type_bytes(type);
    if (!e || peer < 0 || peer >= c->nranks || (count && !buf))
        return fail(c, ncclInvalidArgument, "fake NCCL: %s of type %d with peer %d", call, type, peer);
    if (queued == queue_cap) {
        queue_cap = queue_cap ? 2 * queue_cap : 16;
        queue = realloc(queue, queue_cap * sizeof *queue);
        if (!queue) return ncclSystemError;
    }
    queue[queued++] = (struct p2p){is_send, peer, c, stream, buf, count * e, 0, 0};
    if (group_depth == 0) return submit_queue();
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, int type, int peer, ncclComm_t c, void *stream) {
    return enqueue(1, (void *)send, count, type, peer, c, stream);
}
ncclResult_t ncclRecv(void *recv, size_t count, int type, int peer, ncclComm_t c, void *stream) {
    return enqueue(0, recv, count, type, peer, c, stream);
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return fail(NULL, ncclInvalidUsage, "fake NCCL: ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0 || queued == 0) return ncclSuccess;
    return submit_queue();
}
