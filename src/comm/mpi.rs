//! The MPI implementation of the Comm seam, on host buffers. Every operation is posted
//! non-blocking and completed by polling: when more ranks share a node than it has cores, the
//! poll yields the core between tests, because some MPI builds (Debian's MPICH) busy-wait inside
//! blocking calls and then cost a scheduler time slice per rank per collective.

use super::{Bf16, Comm, CommCounters, Dtype, Half16, Pending, ReduceOp, F16};
use mpi::ffi;
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::traits::AsRaw;
use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::sync::OnceLock;

/// 16-bit float reductions are user operations (MPI has no bf16 or binary16 type): each element
/// is widened to f32, combined, and rounded back (`Half16::combine`, once per pair).
unsafe extern "C" fn bf16_sum(invec: *mut c_void, inoutvec: *mut c_void, len: *mut c_int, _dt: *mut ffi::MPI_Datatype) {
    combine16::<Bf16>(invec, inoutvec, len, ReduceOp::Sum)
}

unsafe extern "C" fn bf16_max(invec: *mut c_void, inoutvec: *mut c_void, len: *mut c_int, _dt: *mut ffi::MPI_Datatype) {
    combine16::<Bf16>(invec, inoutvec, len, ReduceOp::Max)
}

unsafe extern "C" fn f16_sum(invec: *mut c_void, inoutvec: *mut c_void, len: *mut c_int, _dt: *mut ffi::MPI_Datatype) {
    combine16::<F16>(invec, inoutvec, len, ReduceOp::Sum)
}

unsafe extern "C" fn f16_max(invec: *mut c_void, inoutvec: *mut c_void, len: *mut c_int, _dt: *mut ffi::MPI_Datatype) {
    combine16::<F16>(invec, inoutvec, len, ReduceOp::Max)
}

unsafe fn combine16<T: Half16>(invec: *mut c_void, inoutvec: *mut c_void, len: *mut c_int, op: ReduceOp) {
    // SAFETY: MPI passes `len` elements of the uint16 datatype in both buffers.
    let n = *len as usize;
    let a = std::slice::from_raw_parts(invec as *const T, n);
    let b = std::slice::from_raw_parts_mut(inoutvec as *mut T, n);
    for (y, &x) in b.iter_mut().zip(a) {
        *y = T::combine(x, *y, op);
    }
}

/// MPI handles created once per process (the 16-bit float operations).
struct Ops {
    bf16_sum: ffi::MPI_Op,
    bf16_max: ffi::MPI_Op,
    f16_sum: ffi::MPI_Op,
    f16_max: ffi::MPI_Op,
}
// SAFETY: MPI_Op handles are process-global identifiers; they are only used from MPI calls.
unsafe impl Send for Ops {}
// SAFETY: as above.
unsafe impl Sync for Ops {}

fn ops() -> &'static Ops {
    static OPS: OnceLock<Ops> = OnceLock::new();
    OPS.get_or_init(|| {
        let create = |f: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype)| {
            let mut op = std::mem::MaybeUninit::<ffi::MPI_Op>::uninit();
            // SAFETY: MPI is initialised (a Comm exists) and `op` is written by the call.
            unsafe {
                ffi::MPI_Op_create(Some(f), 1, op.as_mut_ptr());
                op.assume_init()
            }
        };
        Ops { bf16_sum: create(bf16_sum), bf16_max: create(bf16_max), f16_sum: create(f16_sum), f16_max: create(f16_max) }
    })
}

fn datatype(dtype: Dtype) -> ffi::MPI_Datatype {
    // SAFETY: reading the library's predefined datatype handles.
    unsafe {
        match dtype {
            Dtype::F32 => ffi::RSMPI_FLOAT,
            Dtype::F64 => ffi::RSMPI_DOUBLE,
            Dtype::Bf16 | Dtype::F16 => ffi::RSMPI_UINT16_T,
        }
    }
}

fn operation(dtype: Dtype, op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: reading the library's predefined operation handles.
    unsafe {
        match (dtype, op) {
            (Dtype::F32 | Dtype::F64, ReduceOp::Sum) => ffi::RSMPI_SUM,
            (Dtype::F32 | Dtype::F64, ReduceOp::Max) => ffi::RSMPI_MAX,
            (Dtype::Bf16, ReduceOp::Sum) => ops().bf16_sum,
            (Dtype::Bf16, ReduceOp::Max) => ops().bf16_max,
            (Dtype::F16, ReduceOp::Sum) => ops().f16_sum,
            (Dtype::F16, ReduceOp::Max) => ops().f16_max,
        }
    }
}

/// `MPI_IN_PLACE` is a macro, not a symbol, and the `mpi` crate does not export it; its value is
/// fixed per implementation family: `(void*)1` in Open MPI, `(void*)-1` in MPICH and its
/// derivatives (Intel MPI, MVAPICH, Cray MPICH). Unknown libraries get None and an extra copy.
static IN_PLACE: OnceLock<Option<usize>> = OnceLock::new();

fn in_place() -> Option<*const c_void> {
    IN_PLACE.get().copied().flatten().map(|v| v as *const c_void)
}

fn in_place_for(library: &str) -> Option<usize> {
    let lib = library.to_ascii_lowercase();
    if lib.contains("open mpi") {
        Some(1)
    } else if ["mpich", "intel(r) mpi", "mvapich", "cray"].iter().any(|name| lib.contains(name)) {
        Some(usize::MAX)
    } else {
        None
    }
}

fn count(bytes: usize, dtype: Dtype) -> c_int {
    c_int::try_from(bytes / dtype.bytes()).expect("a single collective moves at most 2^31 - 1 elements")
}

/// The request of one non-blocking MPI call, which `start` makes given the request's place.
///
/// # Safety
/// `start` must make one non-blocking MPI call that writes the request.
unsafe fn request(start: impl FnOnce(*mut ffi::MPI_Request)) -> ffi::MPI_Request {
    let mut req = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
    start(req.as_mut_ptr());
    req.assume_init()
}

/// Completes `req`, yielding the core between polls when the node is oversubscribed (timed by
/// the watchdog as "an MPI message or posted collective").
fn complete(req: &mut ffi::MPI_Request, oversubscribed: bool) {
    super::watchdog::waiting("an MPI message or posted collective", || complete_now(req, oversubscribed))
}

fn complete_now(req: &mut ffi::MPI_Request, oversubscribed: bool) {
    // SAFETY: `req` is a live request from a non-blocking call whose buffers outlive this wait.
    unsafe {
        if !oversubscribed {
            ffi::MPI_Wait(req, ffi::RSMPI_STATUS_IGNORE);
            return;
        }
        loop {
            let mut done: c_int = 0;
            ffi::MPI_Test(req, &mut done, ffi::RSMPI_STATUS_IGNORE);
            if done != 0 {
                return;
            }
            std::thread::yield_now();
        }
    }
}

/// One MPI communicator as a Comm.
pub struct MpiComm {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    oversubscribed: bool,
    counters: Cell<CommCounters>,
}

impl MpiComm {
    pub fn new(comm: SimpleCommunicator, oversubscribed: bool) -> MpiComm {
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        MpiComm { comm, rank, size, oversubscribed, counters: Cell::new(CommCounters::default()) }
    }

    pub fn raw(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// Runs a collective: the library's blocking form when every rank has a core (its tuned
    /// algorithms are often faster than the non-blocking ones), the non-blocking form completed
    /// by a polling loop that yields when the node is oversubscribed.
    ///
    /// # Safety
    /// The closures must make one MPI call on buffers that outlive this function.
    unsafe fn complete_with(&self, blocking: impl FnOnce(), nonblocking: impl FnOnce(*mut ffi::MPI_Request)) {
        super::watchdog::waiting("an MPI collective", || {
            if !self.oversubscribed {
                blocking();
                return;
            }
            // SAFETY: forwarded to the caller, per this function's contract.
            complete_now(&mut unsafe { request(nonblocking) }, true);
        })
    }

    fn count_sent(&self, f: impl FnOnce(&mut CommCounters)) {
        let mut c = self.counters.get();
        f(&mut c);
        self.counters.set(c);
    }

    /// Posts one non-blocking call on f32 vectors that move into the returned pending value:
    /// `start` gets `send`'s and `recv`'s buffers (which stay put on the heap until the request
    /// completes in `wait` or `drop`) and a place for the request; `wait` returns `recv`.
    ///
    /// # Safety
    /// `start` must make one non-blocking MPI call on those buffers that writes the request.
    unsafe fn post(
        &self,
        send: Vec<f32>,
        mut recv: Vec<f32>,
        start: impl FnOnce(*const c_void, *mut c_void, *mut ffi::MPI_Request),
    ) -> Box<PendingAllReduce> {
        let (s, r) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void);
        let req = request(|req| start(s, r, req));
        Box::new(PendingAllReduce { send, recv, req, oversubscribed: self.oversubscribed, done: false })
    }
}

/// A posted all-reduce or send. Dropping it waits for completion, so its buffers are never freed
/// early.
pub struct PendingAllReduce {
    #[allow(dead_code)] // kept alive for MPI until completion
    send: Vec<f32>,
    recv: Vec<f32>,
    req: ffi::MPI_Request,
    oversubscribed: bool,
    done: bool,
}

impl Pending for PendingAllReduce {
    /// Drives MPI's progress without blocking; true once the reduction finished.
    fn poll(&mut self) -> bool {
        if !self.done {
            let mut flag: c_int = 0;
            // SAFETY: the request is live until `done`.
            unsafe { ffi::MPI_Test(&mut self.req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            self.done = flag != 0;
        }
        self.done
    }

    fn wait(mut self: Box<Self>) -> Vec<f32> {
        if !self.done {
            complete(&mut self.req, self.oversubscribed);
            self.done = true;
        }
        std::mem::take(&mut self.recv)
    }
}

impl Drop for PendingAllReduce {
    fn drop(&mut self) {
        if !self.done {
            complete(&mut self.req, self.oversubscribed);
        }
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_bytes(&self, buf: &mut [u8], dtype: Dtype, op: ReduceOp) {
        let n = count(buf.len(), dtype);
        self.count_sent(|c| c.all_reduce += n as u64);
        let send = if in_place().is_some() { Vec::new() } else { buf.to_vec() };
        let send_ptr = in_place().unwrap_or(send.as_ptr() as *const c_void);
        let recv_ptr = buf.as_mut_ptr() as *mut c_void;
        let (dt, mpi_op, comm) = (datatype(dtype), operation(dtype, op), self.comm.as_raw());
        // SAFETY: both buffers outlive the call, which completes before returning.
        unsafe {
            self.complete_with(
                || {
                    ffi::MPI_Allreduce(send_ptr, recv_ptr, n, dt, mpi_op, comm);
                },
                |req| {
                    ffi::MPI_Iallreduce(send_ptr, recv_ptr, n, dt, mpi_op, comm, req);
                },
            )
        }
    }

    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype) {
        assert_eq!(send.len() * self.size, recv.len());
        let n = count(send.len(), dtype);
        self.count_sent(|c| c.all_gather += n as u64);
        let (dt, comm) = (datatype(dtype), self.comm.as_raw());
        let (s, r) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void);
        // SAFETY: both buffers outlive the call, which completes before returning.
        unsafe {
            self.complete_with(
                || {
                    ffi::MPI_Allgather(s, n, dt, r, n, dt, comm);
                },
                |req| {
                    ffi::MPI_Iallgather(s, n, dt, r, n, dt, comm, req);
                },
            )
        }
    }

    fn reduce_scatter_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype) {
        assert_eq!(recv.len() * self.size, send.len());
        let n = count(recv.len(), dtype);
        self.count_sent(|c| c.reduce_scatter += count(send.len(), dtype) as u64);
        let (dt, op, comm) = (datatype(dtype), operation(dtype, ReduceOp::Sum), self.comm.as_raw());
        let (s, r) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void);
        // SAFETY: both buffers outlive the call, which completes before returning.
        unsafe {
            self.complete_with(
                || {
                    ffi::MPI_Reduce_scatter_block(s, r, n, dt, op, comm);
                },
                |req| {
                    ffi::MPI_Ireduce_scatter_block(s, r, n, dt, op, comm, req);
                },
            )
        }
    }

    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype) {
        assert_eq!(send.len(), recv.len());
        assert_eq!(send.len() % (self.size * dtype.bytes()), 0);
        self.count_sent(|c| c.all_to_all += (send.len() / dtype.bytes()) as u64);
        let n = count(send.len() / self.size, dtype);
        let (dt, comm) = (datatype(dtype), self.comm.as_raw());
        let (s, r) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void);
        // SAFETY: both buffers outlive the call, which completes before returning.
        unsafe {
            self.complete_with(
                || {
                    ffi::MPI_Alltoall(s, n, dt, r, n, dt, comm);
                },
                |req| {
                    ffi::MPI_Ialltoall(s, n, dt, r, n, dt, comm, req);
                },
            )
        }
    }

    fn broadcast_bytes(&self, buf: &mut [u8], dtype: Dtype, root: usize) {
        self.count_sent(|c| c.broadcast += (buf.len() / dtype.bytes()) as u64);
        let n = c_int::try_from(buf.len()).expect("broadcast of at most 2 GiB");
        let (b, comm) = (buf.as_mut_ptr() as *mut c_void, self.comm.as_raw());
        // SAFETY: the buffer outlives the call, which completes before returning.
        unsafe {
            self.complete_with(
                || {
                    ffi::MPI_Bcast(b, n, ffi::RSMPI_UINT8_T, root as c_int, comm);
                },
                |req| {
                    ffi::MPI_Ibcast(b, n, ffi::RSMPI_UINT8_T, root as c_int, comm, req);
                },
            )
        }
    }

    fn reduce_bytes(&self, send: &[u8], recv: &mut [u8], dtype: Dtype, root: usize) {
        assert_eq!(send.len(), recv.len());
        let n = count(send.len(), dtype);
        self.count_sent(|c| c.reduce += n as u64);
        let (dt, op, comm) = (datatype(dtype), operation(dtype, ReduceOp::Sum), self.comm.as_raw());
        let (s, r) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void);
        // SAFETY: both buffers outlive the call, which completes before returning.
        unsafe {
            self.complete_with(
                || {
                    ffi::MPI_Reduce(s, r, n, dt, op, root as c_int, comm);
                },
                |req| {
                    ffi::MPI_Ireduce(s, r, n, dt, op, root as c_int, comm, req);
                },
            )
        }
    }

    fn broadcast_start(&self, buf: Vec<f32>, root: usize) -> Box<dyn Pending> {
        self.count_sent(|c| c.broadcast += buf.len() as u64);
        let (n, dt, comm) = (count(buf.len() * 4, Dtype::F32), datatype(Dtype::F32), self.comm.as_raw());
        // SAFETY: one non-blocking call on the buffer `post` keeps alive.
        unsafe {
            self.post(Vec::new(), buf, |_, b, req| {
                ffi::MPI_Ibcast(b, n, dt, root as c_int, comm, req);
            })
        }
    }

    fn reduce_start(&self, buf: Vec<f32>, root: usize) -> Box<dyn Pending> {
        self.count_sent(|c| c.reduce += buf.len() as u64);
        let recv = vec![0f32; buf.len()];
        let n = count(buf.len() * 4, Dtype::F32);
        let (dt, op, comm) = (datatype(Dtype::F32), operation(Dtype::F32, ReduceOp::Sum), self.comm.as_raw());
        // SAFETY: one non-blocking call on the buffers `post` keeps alive.
        unsafe {
            self.post(buf, recv, |s, r, req| {
                ffi::MPI_Ireduce(s, r, n, dt, op, root as c_int, comm, req);
            })
        }
    }

    fn send_recv_bytes(&self, send: Option<(&[u8], usize)>, recv: Option<(&mut [u8], usize)>) {
        let mut reqs = Vec::with_capacity(2);
        let comm = self.comm.as_raw();
        let bytes = |buf: &[u8]| c_int::try_from(buf.len()).expect("a message of at most 2 GiB");
        // SAFETY: both buffers outlive the requests, which complete before returning.
        unsafe {
            if let Some((buf, peer)) = recv {
                let (b, n) = (buf.as_mut_ptr() as *mut c_void, bytes(buf));
                reqs.push(request(|req| {
                    ffi::MPI_Irecv(b, n, ffi::RSMPI_UINT8_T, peer as c_int, 0, comm, req);
                }));
            }
            if let Some((buf, peer)) = send {
                self.count_sent(|c| c.send += buf.len() as u64);
                let (b, n) = (buf.as_ptr() as *const c_void, bytes(buf));
                reqs.push(request(|req| {
                    ffi::MPI_Isend(b, n, ffi::RSMPI_UINT8_T, peer as c_int, 0, comm, req);
                }));
            }
            for req in &mut reqs {
                complete(req, self.oversubscribed);
            }
        }
    }

    fn barrier(&self) {
        let comm = self.comm.as_raw();
        // SAFETY: a barrier has no buffers; it completes before returning.
        unsafe {
            self.complete_with(
                || {
                    ffi::MPI_Barrier(comm);
                },
                |req| {
                    ffi::MPI_Ibarrier(comm, req);
                },
            )
        }
    }

    fn counters(&self) -> CommCounters {
        self.counters.get()
    }

    /// Starts a sum all-reduce of `buf` that completes in `PendingAllReduce::wait`, so that
    /// gradient buckets can be reduced while backward goes on.
    fn all_reduce_start(&self, buf: Vec<f32>) -> Box<dyn Pending> {
        self.count_sent(|c| c.all_reduce += buf.len() as u64);
        let send = if in_place().is_some() { Vec::new() } else { buf.clone() };
        let n = count(buf.len() * 4, Dtype::F32);
        let (dt, op, comm) = (datatype(Dtype::F32), operation(Dtype::F32, ReduceOp::Sum), self.comm.as_raw());
        // SAFETY: one non-blocking call on the buffers `post` keeps alive.
        unsafe {
            self.post(send, buf, |s, r, req| {
                ffi::MPI_Iallreduce(in_place().unwrap_or(s), r, n, dt, op, comm, req);
            })
        }
    }

    /// Starts a sum reduce-scatter of `send` that completes in `PendingAllReduce::wait` (which
    /// returns this rank's block), so the distributed optimizer's buckets reduce during backward.
    fn reduce_scatter_start(&self, send: Vec<f32>) -> Box<dyn Pending> {
        assert_eq!(send.len() % self.size, 0, "reduce_scatter_start: size equal blocks");
        self.count_sent(|c| c.reduce_scatter += send.len() as u64);
        let recv = vec![0f32; send.len() / self.size];
        let n = count(recv.len() * 4, Dtype::F32);
        let (dt, op, comm) = (datatype(Dtype::F32), operation(Dtype::F32, ReduceOp::Sum), self.comm.as_raw());
        // SAFETY: one non-blocking call on the buffers `post` keeps alive.
        unsafe {
            self.post(send, recv, |s, r, req| {
                ffi::MPI_Ireduce_scatter_block(s, r, n, dt, op, comm, req);
            })
        }
    }

    /// Starts an all-gather of `send` that completes in `PendingAllReduce::wait` (which returns
    /// every rank's `send` in rank order).
    fn all_gather_start(&self, send: Vec<f32>) -> Box<dyn Pending> {
        self.count_sent(|c| c.all_gather += send.len() as u64);
        let recv = vec![0f32; send.len() * self.size];
        let n = count(send.len() * 4, Dtype::F32);
        let (dt, comm) = (datatype(Dtype::F32), self.comm.as_raw());
        // SAFETY: one non-blocking call on the buffers `post` keeps alive.
        unsafe {
            self.post(send, recv, |s, r, req| {
                ffi::MPI_Iallgather(s, n, dt, r, n, dt, comm, req);
            })
        }
    }

    /// Starts a bf16 sum (all-reduce, or with `scatter` reduce-scatter) of `buf` rounded to bf16,
    /// on buffers packed two values to an f32 slot; `wait` widens the result.
    fn sum_start_bf16(&self, buf: Vec<f32>, scatter: bool) -> Box<dyn Pending> {
        let len = if scatter { buf.len() / self.size } else { buf.len() };
        assert!(!scatter || buf.len().is_multiple_of(self.size), "sum_start_bf16: size equal blocks");
        let sent = buf.len() as u64;
        self.count_sent(|c| if scatter { c.reduce_scatter += sent } else { c.all_reduce += sent });
        let (send, recv) = (super::pack_bf16(&buf), vec![0f32; len.div_ceil(2)]);
        let (n, dt, op, comm) =
            (len as c_int, datatype(Dtype::Bf16), operation(Dtype::Bf16, ReduceOp::Sum), self.comm.as_raw());
        // SAFETY: one non-blocking call on the buffers `post` keeps alive (each holds at least
        // the `n` or `n x size` bf16 values the call reads or writes).
        let inner = unsafe {
            self.post(send, recv, |s, r, req| match scatter {
                true => {
                    ffi::MPI_Ireduce_scatter_block(s, r, n, dt, op, comm, req);
                }
                false => {
                    ffi::MPI_Iallreduce(s, r, n, dt, op, comm, req);
                }
            })
        };
        Box::new(super::Widened { inner, len })
    }

    fn send_start(&self, buf: Vec<f32>, peer: usize, tag: u32) -> Box<dyn Pending> {
        self.count_sent(|c| c.send += buf.len() as u64);
        let (n, dt, comm) = (count(buf.len() * 4, Dtype::F32), datatype(Dtype::F32), self.comm.as_raw());
        // SAFETY: one non-blocking call on the buffer `post` keeps alive; `wait` hands it back.
        unsafe {
            self.post(Vec::new(), buf, |_, b, req| {
                ffi::MPI_Isend(b, n, dt, peer as c_int, tag as c_int, comm, req);
            })
        }
    }

    fn recv_tagged(&self, buf: &mut [f32], peer: usize, tag: u32) {
        let (n, dt, comm) = (count(buf.len() * 4, Dtype::F32), datatype(Dtype::F32), self.comm.as_raw());
        let b = buf.as_mut_ptr() as *mut c_void;
        // SAFETY: the buffer outlives the request, which completes before returning.
        unsafe {
            let mut req = request(|req| {
                ffi::MPI_Irecv(b, n, dt, peer as c_int, tag as c_int, comm, req);
            });
            complete(&mut req, self.oversubscribed);
        }
    }
}

/// The MPI side of the process: the universe (finalised on drop) and the world communicator.
pub struct MpiWorld {
    _universe: mpi::environment::Universe,
    pub world: SimpleCommunicator,
    pub library: String,
}

impl MpiWorld {
    pub fn init() -> Option<MpiWorld> {
        let universe = mpi::initialize()?;
        let world = universe.world();
        let library = mpi::environment::library_version()
            .map(|s| s.trim_end_matches('\0').lines().next().unwrap_or("").trim().to_string())
            .unwrap_or_else(|_| "unknown MPI".into());
        let _ = IN_PLACE.set(in_place_for(&library));
        Some(MpiWorld { _universe: universe, world, library })
    }

    /// Rank and size within this node (MPI's shared-memory split of the world).
    pub fn local(&self) -> (usize, usize) {
        let node = self.world.split_shared(self.world.rank());
        (node.rank() as usize, node.size() as usize)
    }

    /// A communicator of the ranks with the same `color`, ordered by `key`. Collective over the
    /// whole world: every rank calls it, in the same order.
    pub fn split(&self, color: usize, key: usize) -> SimpleCommunicator {
        self.world
            .split_by_color_with_key(Color::with_value(color as c_int), key as c_int)
            .expect("every rank passes a defined color")
    }

    pub fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    /// The library's own blocking `MPI_Allreduce` (sum, f32, out of place) on the world, as the
    /// baseline `trident bench allreduce` compares the Comm seam against.
    pub fn library_all_reduce(&self, send: &[f32], recv: &mut [f32]) {
        assert_eq!(send.len(), recv.len());
        // SAFETY: both buffers hold `len` floats and outlive the blocking call.
        unsafe {
            ffi::MPI_Allreduce(
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                count(send.len() * 4, Dtype::F32),
                datatype(Dtype::F32),
                operation(Dtype::F32, ReduceOp::Sum),
                self.world.as_raw(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::in_place_for;

    #[test]
    fn in_place_marker_per_library_family() {
        assert_eq!(in_place_for("Open MPI v4.1.4, package: Debian OpenMPI"), Some(1));
        assert_eq!(in_place_for("MPICH Version:      4.0.2"), Some(usize::MAX));
        assert_eq!(in_place_for("Intel(R) MPI Library 2021.9"), Some(usize::MAX));
        assert_eq!(in_place_for("Some Other MPI"), None);
    }
}
