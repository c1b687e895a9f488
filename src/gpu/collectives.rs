//! The NCCL Comm: collectives and grouped point-to-point transfers on device memory through NCCL
//! or RCCL (one ABI, `nccl.rs`), for the GPU Device's tensor-, pipeline- and data-parallel groups.
//!
//! **Creation** is collective over an MPI group (`&dyn Comm`): rank 0 of the group creates the
//! unique id, the group broadcasts it (`nccl::exchange_unique_id`), and every rank calls
//! `ncclCommInitRank` inside `ncclGroupStart/End`. Each communicator owns its own non-blocking
//! communication stream, so collectives overlap the compute stream; `after_compute` and
//! `before_compute` order the two with events (record on one stream, wait on the other) without
//! blocking the host.
//!
//! **Operations** take device pointers with explicit element counts and dtypes: all-reduce (sum
//! or max; f32, f64, bf16 and binary16), all-gather, reduce-scatter (sum), broadcast, and a group of sends
//! and receives issued between `ncclGroupStart` and `ncclGroupEnd` (pipeline p2p: a stage's send
//! to the next stage and receive from the previous one cannot deadlock each other).
//!
//! **Failures.** A failed call is an `Error::GpuCall` naming the call and the `ncclResult_t`,
//! with `ncclGetLastError`'s text when the library has one. A dead or hung peer never hangs the
//! job: `synchronize` polls the stream and `ncclCommGetAsyncError` instead of blocking in
//! `cuStreamSynchronize`, and after `TRIDENT_NCCL_TIMEOUT_SECS` (default 600 s, PyTorch's NCCL
//! watchdog default) it aborts the communicator (`ncclCommAbort`, which also releases work stuck
//! in NCCL's kernels) and returns an error saying what did not complete. After any error the
//! communicator is aborted and every later call says so.
//!
//! **Comparison.** `Collective` describes one operation and its sizes; `run_on_device` runs it
//! through NCCL and `run_on_host` through the MPI Comm on host buffers, so `trident check nccl`
//! compares the two bit for bit on every rank.

use super::buffer::GpuBuf;
use super::driver::{CuDevicePtr, Driver, Event, PrimaryContext, Stream};
use super::nccl::{self, DataType, Flavor, Nccl, RedOp};
use crate::comm::placement::Placement;
use crate::comm::runtime::Runtime;
use crate::comm::{Bf16, Comm, Dtype, ReduceOp, F16};
use crate::error::{Error, Result};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// The variable that bounds how long `synchronize` waits for the communication stream.
pub const TIMEOUT_VAR: &str = "TRIDENT_NCCL_TIMEOUT_SECS";
/// The default bound: PyTorch's NCCL watchdog default, long enough for any one collective.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// `ncclInProgress`: not an error (a non-blocking communicator still working).
const NCCL_IN_PROGRESS: i32 = 7;

/// The timeout from `TRIDENT_NCCL_TIMEOUT_SECS` (`value`), or the default when unset.
pub fn timeout_from(value: Option<&str>) -> Result<Duration> {
    match value.map(str::trim) {
        None | Some("") => Ok(DEFAULT_TIMEOUT),
        Some(v) => match v.parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() && s < 1e9 => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::Usage(format!(
                "{TIMEOUT_VAR}: found '{v}', expected a positive number of seconds (default {})",
                DEFAULT_TIMEOUT.as_secs()
            ))),
        },
    }
}

/// The timeout of this process's environment.
pub fn timeout() -> Result<Duration> {
    timeout_from(std::env::var(TIMEOUT_VAR).ok().as_deref())
}

/// Calls `poll` until it reports completion (`Ok(true)`), an error, or `timeout` passes
/// (`Ok(false)`), sleeping between polls: from 20 µs up to 1 ms, so a short collective is seen
/// at once and a long one costs little CPU.
pub fn wait_with_timeout(timeout: Duration, mut poll: impl FnMut() -> Result<bool>) -> Result<bool> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(20);
    loop {
        if poll()? {
            return Ok(true);
        }
        if start.elapsed() >= timeout {
            return Ok(false);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// One transfer of a point-to-point group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    Send { buffer: CuDevicePtr, count: usize, dtype: Dtype, peer: usize },
    Recv { buffer: CuDevicePtr, count: usize, dtype: Dtype, peer: usize },
}

/// The GPU API a communicator's stream is made on: the CUDA driver, or the HIP runtime (RCCL on
/// the HIP Device).
#[derive(Clone, Copy)]
pub enum StreamApi<'a> {
    Cuda(&'a Driver),
    Hip(&'a super::hip::Hip),
}

impl<'a> StreamApi<'a> {
    fn streams(self) -> Result<Streams<'a>> {
        Ok(match self {
            StreamApi::Cuda(driver) => Streams::Cuda {
                stream: Stream::non_blocking(driver)?,
                compute_done: Event::new(driver, false)?,
                comm_done: Event::new(driver, false)?,
            },
            StreamApi::Hip(hip) => Streams::Hip(super::hip::HipStreams::new(hip)?),
        })
    }
}

/// A communicator's non-blocking stream and the two events that order it against the compute
/// stream.
enum Streams<'a> {
    Cuda { stream: Stream<'a>, compute_done: Event<'a>, comm_done: Event<'a> },
    Hip(super::hip::HipStreams<'a>),
}

impl Streams<'_> {
    fn handle(&self) -> *mut std::ffi::c_void {
        match self {
            Streams::Cuda { stream, .. } => stream.handle,
            Streams::Hip(h) => h.stream,
        }
    }
    fn is_idle(&self) -> Result<bool> {
        match self {
            Streams::Cuda { stream, .. } => stream.is_idle(),
            Streams::Hip(h) => h.is_idle(),
        }
    }
}

/// An NCCL (or RCCL) communicator over one process group, with its communication stream.
/// Needs the device's context current on this thread for its whole life.
pub struct NcclComm<'a> {
    nccl: &'a Nccl,
    handle: Cell<nccl::NcclComm>,
    streams: Streams<'a>,
    rank: usize,
    size: usize,
    timeout: Duration,
}

impl<'a> NcclComm<'a> {
    /// Creates the communicator of `group`'s ranks: collective over the group, every rank must
    /// call it. `context` is the device's context, current on this thread.
    pub fn new(nccl: &'a Nccl, context: &PrimaryContext<'a>, group: &dyn Comm, timeout: Duration) -> Result<Self> {
        Self::on_current_context(nccl, StreamApi::Cuda(context.driver()), group, timeout)
    }

    /// As `new`, on whatever context (or HIP device) is current on this thread (the GPU Device's,
    /// which its runtime made current).
    pub fn on_current_context(nccl: &'a Nccl, api: StreamApi<'a>, group: &dyn Comm, timeout: Duration) -> Result<Self> {
        // The stream and events first: a failure here leaves no communicator behind.
        let streams = api.streams()?;
        let id = nccl::exchange_unique_id(group, || nccl.unique_id())?;
        Self::init(nccl, streams, id, group.rank(), group.size(), timeout)
    }

    /// The communicator of the pipeline link from stage `from` to stage `to` of `group` (its
    /// ranks are the stages): two ranks, `from` rank 0 and `to` rank 1. `from` creates the unique
    /// id and sends it to `to` over MPI; both must call.
    pub fn link(
        nccl: &'a Nccl,
        api: StreamApi<'a>,
        group: &dyn Comm,
        (from, to): (usize, usize),
        timeout: Duration,
    ) -> Result<Self> {
        let streams = api.streams()?;
        let me = group.rank();
        let maker = format!("pipeline stage {from} (making the link to stage {to})");
        let id = nccl::pass_unique_id((me == from).then_some(|| nccl.unique_id()), &maker, |message| {
            if me == from {
                group.send_recv_bytes(Some((message, to)), None);
            } else {
                group.send_recv_bytes(None, Some((message, from)));
            }
        })?;
        Self::init(nccl, streams, id, usize::from(me != from), 2, timeout)
    }

    /// `ncclCommInitRank` of rank `rank` of `size` with `id`, on the given stream and events.
    fn init(
        nccl: &'a Nccl,
        streams: Streams<'a>,
        id: nccl::UniqueId,
        rank: usize,
        size: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let mut handle: nccl::NcclComm = std::ptr::null_mut();
        // SAFETY: group calls have no arguments; ncclCommInitRank writes one communicator handle;
        // the id is the one every rank of the group received; rank < size.
        unsafe {
            nccl.check("ncclGroupStart", nccl.api.ncclGroupStart()?)?;
            let init = nccl.api.ncclCommInitRank(&mut handle, size as i32, id, rank as i32)?;
            let end = nccl.api.ncclGroupEnd()?;
            let status = nccl
                .check_comm("ncclCommInitRank", init, handle)
                .and_then(|_| nccl.check_comm("ncclGroupEnd", end, handle));
            if let Err(e) = status {
                // A communicator the failed group may have left behind is aborted, not leaked.
                if !handle.is_null() {
                    let _ = nccl.api.ncclCommAbort(handle);
                }
                return Err(e);
            }
        }
        Ok(NcclComm { nccl, handle: Cell::new(handle), streams, rank, size, timeout })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn size(&self) -> usize {
        self.size
    }
    /// The library this communicator runs on: "NCCL" or "RCCL".
    pub fn api(&self) -> &'static str {
        self.nccl.flavor.api()
    }
    /// The communication stream on the CUDA driver (for timing events in the benchmarks).
    pub fn cuda_stream(&self) -> Option<&Stream<'a>> {
        match &self.streams {
            Streams::Cuda { stream, .. } => Some(stream),
            Streams::Hip(_) => None,
        }
    }

    fn live(&self, call: &str) -> Result<nccl::NcclComm> {
        let h = self.handle.get();
        if h.is_null() {
            return Err(Error::Comm(format!(
                "{}: {call} on rank {} of {}: the communicator was aborted after an earlier error",
                self.api(),
                self.rank,
                self.size
            )));
        }
        Ok(h)
    }

    /// Aborts the communicator (after an error); later calls fail with a clear message.
    fn abort(&self) {
        let h = self.handle.replace(std::ptr::null_mut());
        if !h.is_null() {
            // SAFETY: h is a live communicator, aborted once; errors at abort are not actionable.
            let _ = unsafe { self.nccl.api.ncclCommAbort(h) };
        }
    }

    /// Checks the status of an enqueue, aborting the communicator on failure.
    fn checked(&self, call: &'static str, code: i32) -> Result<()> {
        let result = self.nccl.check_comm(call, code, self.handle.get());
        if result.is_err() {
            self.abort();
        }
        result
    }

    /// Work enqueued on the communication stream from now on starts after the work already
    /// enqueued on `compute` (None: the legacy default stream): a collective reads what the
    /// compute stream wrote.
    pub fn after_compute(&self, compute: Option<&Stream>) -> Result<()> {
        match (&self.streams, compute) {
            (Streams::Cuda { stream, compute_done, .. }, _) => {
                compute_done.record(compute)?;
                stream.wait(compute_done)
            }
            (Streams::Hip(h), None) => h.after_compute(),
            (Streams::Hip(_), Some(_)) => Err(Error::Comm("a HIP communicator ordered against a CUDA stream".into())),
        }
    }

    /// Work enqueued on `compute` (None: the legacy default stream) from now on starts after the
    /// collectives already enqueued: the compute stream reads what a collective wrote, without
    /// blocking the host.
    pub fn before_compute(&self, compute: Option<&Stream>) -> Result<()> {
        match (&self.streams, compute) {
            (Streams::Cuda { stream, comm_done, .. }, _) => {
                comm_done.record(Some(stream))?;
                let driver = stream.driver();
                let handle = compute.map_or(std::ptr::null_mut(), |s| s.handle);
                // SAFETY: the stream (or the default stream) and the event are live; flags must be 0.
                driver.check("cuStreamWaitEvent", unsafe { driver.api.cuStreamWaitEvent(handle, comm_done.handle, 0) }?)
            }
            (Streams::Hip(h), None) => h.before_compute(),
            (Streams::Hip(_), Some(_)) => Err(Error::Comm("a HIP communicator ordered against a CUDA stream".into())),
        }
    }

    /// `recv[count]` = the element-wise `op` over ranks of `send[count]` (in place when equal).
    pub fn all_reduce(
        &self,
        send: CuDevicePtr,
        recv: CuDevicePtr,
        count: usize,
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        let h = self.live("ncclAllReduce")?;
        // SAFETY: the pointers are device buffers of at least count elements of dtype (the
        // caller's contract); the stream and communicator are live.
        let code = unsafe {
            self.nccl.api.ncclAllReduce(
                send as *const _,
                recv as *mut _,
                count,
                DataType::of(dtype),
                RedOp::of(op),
                h,
                self.streams.handle(),
            )
        }?;
        self.checked("ncclAllReduce", code)
    }

    /// `recv[size · send_count]` = every rank's `send[send_count]`, in rank order.
    pub fn all_gather(&self, send: CuDevicePtr, recv: CuDevicePtr, send_count: usize, dtype: Dtype) -> Result<()> {
        let h = self.live("ncclAllGather")?;
        // SAFETY: as all_reduce, with recv holding size · send_count elements.
        let code = unsafe {
            self.nccl.api.ncclAllGather(
                send as *const _,
                recv as *mut _,
                send_count,
                DataType::of(dtype),
                h,
                self.streams.handle(),
            )
        }?;
        self.checked("ncclAllGather", code)
    }

    /// `recv[recv_count]` = the sum over ranks of this rank's block of `send[size · recv_count]`.
    pub fn reduce_scatter(&self, send: CuDevicePtr, recv: CuDevicePtr, recv_count: usize, dtype: Dtype) -> Result<()> {
        let h = self.live("ncclReduceScatter")?;
        // SAFETY: as all_reduce, with send holding size · recv_count elements.
        let code = unsafe {
            self.nccl.api.ncclReduceScatter(
                send as *const _,
                recv as *mut _,
                recv_count,
                DataType::of(dtype),
                RedOp::Sum,
                h,
                self.streams.handle(),
            )
        }?;
        self.checked("ncclReduceScatter", code)
    }

    /// `recv[count]` = root's `send[count]` (`send` is read on root only).
    pub fn broadcast(
        &self,
        send: CuDevicePtr,
        recv: CuDevicePtr,
        count: usize,
        dtype: Dtype,
        root: usize,
    ) -> Result<()> {
        let h = self.live("ncclBroadcast")?;
        // SAFETY: as all_reduce; root < size is checked by the library.
        let code = unsafe {
            self.nccl.api.ncclBroadcast(
                send as *const _,
                recv as *mut _,
                count,
                DataType::of(dtype),
                root as i32,
                h,
                self.streams.handle(),
            )
        }?;
        self.checked("ncclBroadcast", code)
    }

    /// Issues every transfer inside one `ncclGroupStart/End`, so sends and receives between the
    /// same ranks in both directions (a pipeline's forward and backward p2p, a ring) progress
    /// together instead of deadlocking.
    pub fn send_recv(&self, transfers: &[Transfer]) -> Result<()> {
        let h = self.live("ncclGroupEnd")?;
        // SAFETY: group calls have no arguments; each transfer's buffer holds count elements of
        // its dtype (the caller's contract); the stream and communicator are live. The group is
        // always ended, also after a failed enqueue, so the library's group state stays balanced.
        unsafe {
            self.checked("ncclGroupStart", self.nccl.api.ncclGroupStart()?)?;
            let mut first_error = Ok(());
            for t in transfers {
                let (call, code) = match *t {
                    Transfer::Send { buffer, count, dtype, peer } => (
                        "ncclSend",
                        self.nccl.api.ncclSend(
                            buffer as *const _,
                            count,
                            DataType::of(dtype),
                            peer as i32,
                            h,
                            self.streams.handle(),
                        ),
                    ),
                    Transfer::Recv { buffer, count, dtype, peer } => (
                        "ncclRecv",
                        self.nccl.api.ncclRecv(
                            buffer as *mut _,
                            count,
                            DataType::of(dtype),
                            peer as i32,
                            h,
                            self.streams.handle(),
                        ),
                    ),
                };
                if first_error.is_ok() {
                    first_error = code.and_then(|c| self.nccl.check_comm(call, c, h));
                }
            }
            let end = self.nccl.api.ncclGroupEnd()?;
            if first_error.is_err() {
                self.abort();
                return first_error;
            }
            self.checked("ncclGroupEnd", end)
        }
    }

    /// Block `j` of `recv` becomes block `rank` of rank j's `send`, each block `count` elements:
    /// one grouped send and receive per rank (this one included), as NCCL has no all-to-all call.
    pub fn all_to_all(&self, send: CuDevicePtr, recv: CuDevicePtr, count: usize, dtype: Dtype) -> Result<()> {
        let bytes = (count * dtype.bytes()) as CuDevicePtr;
        let transfers: Vec<Transfer> = (0..self.size())
            .flat_map(|peer| {
                let at = peer as CuDevicePtr * bytes;
                [
                    Transfer::Send { buffer: send + at, count, dtype, peer },
                    Transfer::Recv { buffer: recv + at, count, dtype, peer },
                ]
            })
            .collect();
        self.send_recv(&transfers)
    }

    /// Waits until every operation enqueued on the communication stream has finished, polling
    /// the stream and the communicator's asynchronous error; after the timeout, aborts the
    /// communicator and returns an error naming the wait.
    pub fn synchronize(&self) -> Result<()> {
        let h = self.live("synchronize")?;
        let done = wait_with_timeout(self.timeout, || {
            // The asynchronous error first: a failed operation may leave the stream idle.
            let mut async_error = 0;
            // SAFETY: writes one ncclResult_t of a live communicator.
            let code = unsafe { self.nccl.api.ncclCommGetAsyncError(h, &mut async_error) }?;
            self.nccl.check_comm("ncclCommGetAsyncError", code, h)?;
            if async_error != 0 && async_error != NCCL_IN_PROGRESS {
                return self
                    .nccl
                    .check_comm("an enqueued operation (ncclCommGetAsyncError)", async_error, h)
                    .map(|_| false);
            }
            self.streams.is_idle()
        });
        match done {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.abort();
                Err(Error::Comm(format!(
                    "{}: rank {} of {}: the communication stream did not finish within {:.0} s ({TIMEOUT_VAR}); \
                     a peer rank has probably exited or hung; the communicator was aborted",
                    self.api(),
                    self.rank,
                    self.size,
                    self.timeout.as_secs_f64()
                )))
            }
            Err(e) => {
                self.abort();
                Err(e)
            }
        }
    }
}

impl Drop for NcclComm<'_> {
    fn drop(&mut self) {
        let h = self.handle.replace(std::ptr::null_mut());
        if !h.is_null() {
            // SAFETY: a live communicator whose work has been waited for (or not: destroy then
            // waits for it, which is what the owner asked for by dropping it).
            let _ = unsafe { self.nccl.api.ncclCommDestroy(h) };
        }
    }
}

/// An NCCL communicator serving the CUDA Device as the `DeviceComm` of one process group: every
/// operation is ordered after the Device's compute stream (the legacy default stream) with an
/// event and the compute stream after it with another, so neither the host nor the compute
/// stream blocks; the host waits (polled, bounded by `TRIDENT_NCCL_TIMEOUT_SECS`) only in
/// `settle`, which the Device calls before it copies anything to the host. The library and
/// driver tables it borrows are loaded once per process and kept for its life.
pub struct DeviceNccl {
    comm: std::sync::Mutex<NcclComm<'static>>,
    api: &'static str,
    /// Operations enqueued since the last `settle`.
    enqueued: std::sync::atomic::AtomicBool,
    /// Elements counted as the MPI Comm counts them (`--log-comm`).
    counted: std::sync::Mutex<crate::comm::CommCounters>,
}

// SAFETY: an NCCL communicator and CUDA streams and events may be used from any thread, one
// thread at a time, which the mutex ensures.
unsafe impl Send for DeviceNccl {}
// SAFETY: as above: every use goes through the mutex.
unsafe impl Sync for DeviceNccl {}

impl DeviceNccl {
    /// Creates the communicator of `group` (collective over the group) on the current context.
    pub fn new(nccl: &'static Nccl, api: StreamApi<'static>, group: &dyn Comm) -> Result<DeviceNccl> {
        let comm = NcclComm::on_current_context(nccl, api, group, timeout()?)?;
        Ok(DeviceNccl {
            api: comm.api(),
            comm: std::sync::Mutex::new(comm),
            enqueued: std::sync::atomic::AtomicBool::new(false),
            counted: std::sync::Mutex::new(crate::comm::CommCounters::default()),
        })
    }

    /// Runs `f` on the communicator; a failure abandons the op (the Device's ops return no
    /// `Result`: `error::fail`), after the communicator was aborted, and the command ends with it.
    fn run(&self, f: impl FnOnce(&NcclComm<'static>) -> Result<()>) {
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f(&comm) {
            drop(comm);
            crate::error::fail(e.within("--gpu-collectives"));
        }
        self.enqueued.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Waits, polling, until every operation enqueued on the communication stream finished; a
    /// dead or hung peer is an error after the timeout, not a hang.
    pub fn settle(&self) {
        if self.enqueued.swap(false, std::sync::atomic::Ordering::Relaxed) {
            self.run(|c| c.synchronize());
            self.enqueued.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn count(&self, f: impl FnOnce(&mut crate::comm::CommCounters)) {
        f(&mut self.counted.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn ordered(&self, f: impl FnOnce(&NcclComm<'static>) -> Result<()>) {
        self.run(|c| {
            c.after_compute(None)?;
            f(c)?;
            c.before_compute(None)
        })
    }
}

impl crate::device::DeviceComm<GpuBuf> for DeviceNccl {
    fn api(&self) -> &'static str {
        self.api
    }
    fn all_reduce(&self, buf: &mut GpuBuf) {
        let (p, n, t) = (buf.ptr(), buf.len(), buf.dtype());
        self.count(|k| k.all_reduce += n as u64);
        self.ordered(|c| c.all_reduce(p, p, n, t, ReduceOp::Sum));
    }
    fn all_reduce_f64(&self, scalars: &mut GpuBuf, len: usize, op: ReduceOp) {
        self.count(|k| k.all_reduce += len as u64);
        self.ordered(|c| c.all_reduce(scalars.ptr(), scalars.ptr(), len, Dtype::F64, op));
    }
    fn all_reduce_start(&self, buf: &mut GpuBuf) {
        let (p, n, t) = (buf.ptr(), buf.len(), buf.dtype());
        self.count(|k| k.all_reduce += n as u64);
        self.run(|c| {
            c.after_compute(None)?;
            c.all_reduce(p, p, n, t, ReduceOp::Sum)
        });
    }
    fn wait(&self) {
        self.run(|c| c.before_compute(None));
    }
    fn synchronize(&self) {
        self.settle();
    }
    fn all_gather(&self, local: &GpuBuf, full: &mut GpuBuf) {
        let (send, recv, n, t) = (local.ptr(), full.ptr(), local.len(), local.dtype_with(full));
        assert_eq!(full.len(), n * self.comm.lock().map_or(1, |c| c.size()), "all_gather: buffer sizes");
        self.count(|k| k.all_gather += n as u64);
        self.ordered(|c| c.all_gather(send, recv, n, t));
    }
    fn reduce_scatter(&self, full: &GpuBuf, local: &mut GpuBuf) {
        self.reduce_scatter_start(full, local);
        self.wait();
    }
    fn reduce_scatter_start(&self, full: &GpuBuf, local: &mut GpuBuf) {
        let (send, recv, n, t) = (full.ptr(), local.ptr(), local.len(), full.dtype_with(local));
        assert_eq!(full.len(), n * self.comm.lock().map_or(1, |c| c.size()), "reduce_scatter: buffer sizes");
        self.count(|k| k.reduce_scatter += full.len() as u64);
        self.run(|c| {
            c.after_compute(None)?;
            c.reduce_scatter(send, recv, n, t)
        });
    }
    fn all_to_all(&self, send: &GpuBuf, recv: &mut GpuBuf) {
        let (s, r, n, t) = (send.ptr(), recv.ptr(), send.len(), send.dtype_with(recv));
        let size = self.comm.lock().map_or(1, |c| c.size());
        assert!(recv.len() == n && n % size == 0, "all_to_all: buffer sizes");
        self.count(|k| k.all_to_all += n as u64);
        self.ordered(|c| c.all_to_all(s, r, n / size, t));
    }
    fn ring_pass_start(&self, send: &GpuBuf, recv: &mut GpuBuf) {
        let (s, r, n, t) = (send.ptr(), recv.ptr(), send.len(), send.dtype_with(recv));
        assert_eq!(recv.len(), n, "ring pass: buffer sizes");
        self.count(|k| k.send += n as u64);
        self.run(|c| {
            let (rank, size) = (c.rank(), c.size());
            let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
            c.after_compute(None)?;
            let send = Transfer::Send { buffer: s, count: n, dtype: t, peer: next };
            c.send_recv(&[send, Transfer::Recv { buffer: r, count: n, dtype: t, peer: prev }])
        });
    }
    fn counters(&self) -> crate::comm::CommCounters {
        *self.counted.lock().unwrap_or_else(|p| p.into_inner())
    }
}
/// One collective with its sizes, runnable through NCCL on device memory (`run_on_device`) or
/// through the MPI Comm on host memory (`run_on_host`), for comparing the two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce {
        count: usize,
        dtype: Dtype,
        op: ReduceOp,
    },
    AllGather {
        send_count: usize,
        dtype: Dtype,
    },
    ReduceScatter {
        recv_count: usize,
        dtype: Dtype,
    },
    Broadcast {
        count: usize,
        dtype: Dtype,
        root: usize,
    },
    /// Every rank sends `count` elements to rank + 1 and receives from rank - 1 (a ring of
    /// grouped send/recv, as pipeline p2p issues them).
    RingSendRecv {
        count: usize,
        dtype: Dtype,
    },
    /// Every rank sends each rank (itself included) its own block of `count` elements.
    AllToAll {
        count: usize,
        dtype: Dtype,
    },
}

impl Collective {
    pub fn dtype(&self) -> Dtype {
        match *self {
            Collective::AllReduce { dtype, .. }
            | Collective::AllGather { dtype, .. }
            | Collective::ReduceScatter { dtype, .. }
            | Collective::Broadcast { dtype, .. }
            | Collective::RingSendRecv { dtype, .. }
            | Collective::AllToAll { dtype, .. } => dtype,
        }
    }

    /// Elements of the send and receive buffers on a group of `ranks`.
    pub fn counts(&self, ranks: usize) -> (usize, usize) {
        match *self {
            Collective::AllReduce { count, .. }
            | Collective::Broadcast { count, .. }
            | Collective::RingSendRecv { count, .. } => (count, count),
            Collective::AllGather { send_count, .. } => (send_count, send_count * ranks),
            Collective::ReduceScatter { recv_count, .. } => (recv_count * ranks, recv_count),
            Collective::AllToAll { count, .. } => (count * ranks, count * ranks),
        }
    }

    pub fn name(&self) -> String {
        let dtype = self.dtype().name();
        match *self {
            Collective::AllReduce { count, op, .. } => {
                format!("all_reduce {} of {count} {dtype}", if op == ReduceOp::Sum { "sum" } else { "max" })
            }
            Collective::AllGather { send_count, .. } => format!("all_gather of {send_count} {dtype} per rank"),
            Collective::ReduceScatter { recv_count, .. } => format!("reduce_scatter to {recv_count} {dtype} per rank"),
            Collective::Broadcast { count, root, .. } => format!("broadcast of {count} {dtype} from rank {root}"),
            Collective::RingSendRecv { count, .. } => format!("grouped send/recv of {count} {dtype} around the ring"),
            Collective::AllToAll { count, .. } => format!("all-to-all of {count} {dtype} per pair of ranks"),
        }
    }
}

/// Enqueues `c` on `comm`'s stream with device buffers `send` and `recv` (sized by `counts`).
pub fn run_on_device(comm: &NcclComm, c: &Collective, send: CuDevicePtr, recv: CuDevicePtr) -> Result<()> {
    match *c {
        Collective::AllReduce { count, dtype, op } => comm.all_reduce(send, recv, count, dtype, op),
        Collective::AllGather { send_count, dtype } => comm.all_gather(send, recv, send_count, dtype),
        Collective::ReduceScatter { recv_count, dtype } => comm.reduce_scatter(send, recv, recv_count, dtype),
        Collective::Broadcast { count, dtype, root } => comm.broadcast(send, recv, count, dtype, root),
        Collective::RingSendRecv { count, dtype } => {
            let n = comm.size();
            comm.send_recv(&[
                Transfer::Send { buffer: send, count, dtype, peer: (comm.rank() + 1) % n },
                Transfer::Recv { buffer: recv, count, dtype, peer: (comm.rank() + n - 1) % n },
            ])
        }
        Collective::AllToAll { count, dtype } => comm.all_to_all(send, recv, count, dtype),
    }
}

/// Runs `c` through the Comm seam on host bytes: `recv` gets what `run_on_device` leaves in the
/// device's receive buffer.
pub fn run_on_host(comm: &dyn Comm, c: &Collective, send: &[u8], recv: &mut [u8]) {
    let n = comm.size();
    match *c {
        Collective::AllReduce { dtype, op, .. } => {
            recv.copy_from_slice(send);
            if n > 1 {
                comm.all_reduce_bytes(recv, dtype, op);
            }
        }
        Collective::AllGather { dtype, .. } => comm.all_gather_bytes(send, recv, dtype),
        Collective::ReduceScatter { dtype, .. } => comm.reduce_scatter_bytes(send, recv, dtype),
        Collective::Broadcast { dtype, root, .. } => {
            recv.copy_from_slice(send);
            if n > 1 {
                comm.broadcast_bytes(recv, dtype, root);
            }
        }
        Collective::RingSendRecv { .. } => {
            let (next, prev) = ((comm.rank() + 1) % n, (comm.rank() + n - 1) % n);
            comm.send_recv_bytes(Some((send, next)), Some((recv, prev)));
        }
        Collective::AllToAll { dtype, .. } => comm.all_to_all_bytes(send, recv, dtype),
    }
}

/// Rank `rank`'s input of `len` elements: multiples of 1/8 in [-4, 4), so any sum over up to 64
/// ranks is exact in f32, bf16 and binary16 whatever the order of additions (NCCL's ring and MPI's tree
/// add in different orders; with these values they must agree bit for bit).
pub fn check_input(dtype: Dtype, len: usize, rank: usize, salt: usize) -> Vec<u8> {
    let value = |i: usize| ((i * 7 + rank * 13 + salt * 5) % 64) as f32 / 8.0 - 4.0;
    match dtype {
        Dtype::F32 => (0..len).flat_map(|i| value(i).to_le_bytes()).collect(),
        Dtype::F64 => (0..len).flat_map(|i| (value(i) as f64).to_le_bytes()).collect(),
        Dtype::Bf16 => (0..len).flat_map(|i| Bf16::from_f32(value(i)).0.to_le_bytes()).collect(),
        Dtype::F16 => (0..len).flat_map(|i| F16::from_f32(value(i)).0.to_le_bytes()).collect(),
    }
}

/// The device ordinal this rank drives among `devices` of `kind` ("cuda" or "hip"), chosen as
/// training chooses it (`comm::placement`: the node-local rank over the visible devices, or
/// `TRIDENT_GPU_ORDER`). `runtime` names the library for the error when it sees no device.
pub fn rank_device_of(rt: &Runtime, devices: usize, kind: &str, runtime: &str, command: &str) -> Result<usize> {
    if devices == 0 {
        return Err(Error::Usage(format!("{command} needs a GPU: the {runtime} sees no device")));
    }
    let placement = Placement::decide(
        (rt.world_rank, rt.world_size),
        (rt.local_rank, rt.local_size),
        kind,
        Some(devices),
        &|name: &str| std::env::var(name).ok(),
    )?;
    let ordinal = placement.gpu.map_or(0, |g| g.ordinal);
    if ordinal >= devices {
        return Err(Error::Usage(format!("{command}: device {ordinal} was chosen but the {runtime} sees {devices}")));
    }
    Ok(ordinal)
}

/// `rank_device_of` for the CUDA driver.
pub fn rank_device(rt: &Runtime, driver: &Driver, command: &str) -> Result<usize> {
    rank_device_of(rt, driver.device_count()?, "cuda", &format!("driver ({})", driver.path()), command)
}

/// RCCL over every rank of the job on this rank's AMD GPU (placed as training places it), for
/// `check nccl` and `bench allreduce --device hip` on a node without a CUDA driver.
pub struct RcclOnHip {
    /// The GPU's runtime, current on this thread (the communicator's stream is made on it).
    pub device: super::runtime::Counted<super::hip_runtime::HipRuntime>,
    pub nccl: Nccl,
    pub world: Box<dyn Comm>,
    pub name: String,
}

impl RcclOnHip {
    pub fn open(rt: &Runtime, hip: super::hip::Hip, command: &str) -> Result<RcclOnHip> {
        let ordinal = rank_device_of(rt, hip.device_count()?, "hip", "HIP runtime", command)?;
        let name = hip.device_info(ordinal)?.name;
        let device = super::runtime::Counted::new(super::hip_runtime::HipRuntime::new(hip, ordinal)?);
        let nccl = Nccl::load(Flavor::Rccl)?;
        let world = rt.group(&(0..rt.world_size).collect::<Vec<_>>());
        Ok(RcclOnHip { device, nccl, world, name })
    }

    /// The communicator over the job, its stream on the HIP runtime.
    pub fn comm(&self) -> Result<NcclComm<'_>> {
        let stream_api = StreamApi::Hip(self.device.vendor().hip());
        NcclComm::on_current_context(&self.nccl, stream_api, self.world.as_ref(), timeout()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SelfComm;

    #[test]
    fn the_timeout_comes_from_its_variable_or_defaults_to_ten_minutes() {
        assert_eq!(timeout_from(None).unwrap(), Duration::from_secs(600));
        assert_eq!(timeout_from(Some("")).unwrap(), Duration::from_secs(600));
        assert_eq!(timeout_from(Some("2.5")).unwrap(), Duration::from_millis(2500));
        for bad in ["0", "-3", "soon", "inf", "NaN"] {
            let e = timeout_from(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("TRIDENT_NCCL_TIMEOUT_SECS: found") && e.contains("positive number of seconds"), "{e}");
        }
    }

    #[test]
    fn a_wait_that_never_completes_ends_at_the_timeout_and_one_that_does_at_once() {
        let start = Instant::now();
        let mut polls = 0;
        let done = wait_with_timeout(Duration::from_millis(50), || {
            polls += 1;
            Ok(false)
        })
        .unwrap();
        let waited = start.elapsed();
        assert!(!done);
        assert!(waited >= Duration::from_millis(50) && waited < Duration::from_secs(2), "{waited:?}");
        assert!(polls > 5, "polled repeatedly: {polls}");
        let mut polls = 0;
        assert!(wait_with_timeout(Duration::from_secs(60), || {
            polls += 1;
            Ok(polls == 3)
        })
        .unwrap());
        assert_eq!(polls, 3);
        // An error from the poll (an asynchronous NCCL error) ends the wait with that error.
        let e = wait_with_timeout(Duration::from_secs(60), || Err(Error::Comm("peer gone".into()))).unwrap_err();
        assert!(e.to_string().contains("peer gone"));
    }

    #[test]
    fn case_sizes_and_names() {
        let c = Collective::AllGather { send_count: 3, dtype: Dtype::Bf16 };
        assert_eq!(c.counts(4), (3, 12));
        assert_eq!(Collective::ReduceScatter { recv_count: 3, dtype: Dtype::F32 }.counts(4), (12, 3));
        assert_eq!(c.name(), "all_gather of 3 bf16 per rank");
    }

    #[test]
    fn check_inputs_sum_exactly_in_any_order() {
        // Sixty-four ranks' values, summed forwards and backwards, agree exactly in every type.
        let len = 257;
        let ranks: Vec<Vec<f32>> =
            (0..64).map(|r| bytemuck::cast_slice::<u8, f32>(&check_input(Dtype::F32, len, r, 1)).to_vec()).collect();
        for i in 0..len {
            let forward: f32 = ranks.iter().map(|v| v[i]).sum();
            let backward: f32 = ranks.iter().rev().map(|v| v[i]).sum();
            assert_eq!(forward, backward);
            assert_eq!(Bf16::from_f32(forward).to_f32(), forward, "exact in bf16");
            assert_eq!(F16::from_f32(forward).to_f32(), forward, "exact in binary16");
        }
        let b = check_input(Dtype::Bf16, 3, 2, 0);
        assert_eq!(b.len(), 6);
    }

    #[test]
    fn host_ops_on_a_group_of_one_are_copies() {
        let send = check_input(Dtype::F32, 5, 0, 0);
        for c in [
            Collective::AllReduce { count: 5, dtype: Dtype::F32, op: ReduceOp::Sum },
            Collective::AllGather { send_count: 5, dtype: Dtype::F32 },
            Collective::ReduceScatter { recv_count: 5, dtype: Dtype::F32 },
            Collective::Broadcast { count: 5, dtype: Dtype::F32, root: 0 },
            Collective::RingSendRecv { count: 5, dtype: Dtype::F32 },
            Collective::AllToAll { count: 5, dtype: Dtype::F32 },
        ] {
            let mut recv = vec![0u8; 20];
            run_on_host(&SelfComm, &c, &send, &mut recv);
            assert_eq!(recv, send, "{}", c.name());
        }
    }
}
