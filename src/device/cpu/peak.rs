//! A short probe of this machine's f32 FMA throughput, the denominator for "fraction of peak" in
//! GEMM benchmarks and start-up logs.
//!
//! Every pool thread runs a loop of independent FMA chains (enough accumulators to cover the FMA
//! latency on every port) on the widest vector unit `best_kernel` would use. Work is counted in
//! chunks of a fixed iteration count between clock reads, so the timer's granularity and cost do
//! not matter, and the accumulators pass through `black_box` so the loop cannot be deleted. The
//! aggregate rate is all threads' FLOPs over the common measurement window, so threads that did
//! not actually overlap cannot inflate it.

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::gemm::{best_kernel, GemmKernel};
use super::pool::ThreadPool;

/// The measured FMA throughput of one pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peak {
    /// Aggregate GFLOP/s of all threads together (one FMA counts as two FLOPs).
    pub gflops: f64,
    /// `gflops / threads`.
    pub gflops_per_thread: f64,
    pub threads: usize,
    /// Which instruction set was measured, e.g. "avx512f".
    pub isa: &'static str,
}

/// One timed burst per thread: FLOPs done inside the window and the window itself.
struct Burst {
    flops: f64,
    begin: Instant,
    end: Instant,
}

/// Measures the aggregate FMA peak of `pool` over about `millis` milliseconds (plus a warm-up of
/// a fifth of that, at most 30 ms, which lets clocks and wide units power up).
pub fn measure_fma_peak(pool: &ThreadPool, millis: u64) -> Peak {
    let kernel = best_kernel();
    let warmup = Duration::from_millis((millis / 5).clamp(1, 30));
    let window = Duration::from_millis(millis.max(1));
    let start = Instant::now();
    let (measure_from, measure_until) = (start + warmup, start + warmup + window);
    let bursts = Mutex::new(Vec::new());

    pool.run(pool.threads(), &|_| {
        let mut chunk = fma_chunk(kernel);
        // Warm up with the same code, then count whole chunks until the deadline.
        while Instant::now() < measure_from {
            chunk.run();
        }
        // At least one chunk: a thread the OS starts after the window closed still measures.
        let begin = Instant::now();
        let mut chunks = 0u64;
        let end = loop {
            chunk.run();
            chunks += 1;
            let now = Instant::now();
            if now >= measure_until {
                break now;
            }
        };
        let burst = Burst { flops: chunks as f64 * chunk.flops_per_chunk(), begin, end };
        bursts.lock().unwrap_or_else(|p| p.into_inner()).push(burst);
    });

    let bursts = bursts.into_inner().unwrap_or_else(|p| p.into_inner());
    let flops: f64 = bursts.iter().map(|b| b.flops).sum();
    let begin = bursts.iter().map(|b| b.begin).min().unwrap_or(start);
    let end = bursts.iter().map(|b| b.end).max().unwrap_or(start);
    let seconds = end.duration_since(begin).as_secs_f64().max(1e-9);
    let gflops = flops / seconds / 1e9;
    let threads = pool.threads();
    Peak { gflops, gflops_per_thread: gflops / threads as f64, threads, isa: isa_name(kernel) }
}

fn isa_name(kernel: GemmKernel) -> &'static str {
    match kernel {
        GemmKernel::Avx512 => "avx512f",
        GemmKernel::Avx2 => "avx2+fma",
        GemmKernel::Portable => "portable",
    }
}

/// Loop iterations between two clock reads: a few microseconds of FMAs, far above the cost and
/// granularity of `Instant::now`.
const ITERATIONS_PER_CHUNK: usize = 4096;

/// Independent zmm accumulators: two FMA ports × four cycles of latency need eight; sixteen
/// leaves headroom for wider or slower cores.
const AVX512_ACCUMULATORS: usize = 16;
/// Independent ymm accumulators: twelve of the sixteen ymm registers, the rest hold constants.
const AVX2_ACCUMULATORS: usize = 12;
/// Lanes of the portable loop, which the compiler vectorises at the baseline width.
const PORTABLE_LANES: usize = 64;

const STATE_FLOATS: usize = 16 * AVX512_ACCUMULATORS;

/// One thread's FMA loop. Each chunk multiplies the accumulators by a number just below one and
/// adds a small constant, so values converge to a fixed point instead of overflowing or going
/// subnormal (which would slow the units down). The state lives in memory between chunks.
struct FmaChunk {
    kernel: GemmKernel,
    state: [f32; STATE_FLOATS],
}

fn fma_chunk(kernel: GemmKernel) -> FmaChunk {
    FmaChunk { kernel, state: [0.5; STATE_FLOATS] }
}

const SCALE: f32 = 0.999_999;
const OFFSET: f32 = 1.0e-6;

impl FmaChunk {
    fn flops_per_chunk(&self) -> f64 {
        let lanes = match self.kernel {
            GemmKernel::Avx512 => 16 * AVX512_ACCUMULATORS,
            GemmKernel::Avx2 => 8 * AVX2_ACCUMULATORS,
            GemmKernel::Portable => PORTABLE_LANES,
        };
        (2 * lanes * ITERATIONS_PER_CHUNK) as f64
    }

    fn run(&mut self) {
        match self.kernel {
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            // SAFETY: best_kernel() returns Avx512 only where isa::detected found AVX-512.
            GemmKernel::Avx512 => unsafe { x86::chunk_avx512(&mut self.state) },
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            // SAFETY: best_kernel() returns Avx2 only where isa::detected found AVX2 and FMA.
            GemmKernel::Avx2 => unsafe { x86::chunk_avx2(&mut self.state) },
            _ => {
                let lanes = &mut self.state[..PORTABLE_LANES];
                for _ in 0..ITERATIONS_PER_CHUNK {
                    for value in lanes.iter_mut() {
                        *value = *value * SCALE + OFFSET;
                    }
                }
                black_box(lanes);
            }
        }
    }
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
mod x86 {
    #[cfg(target_arch = "x86")]
    use std::arch::x86::*;
    #[cfg(target_arch = "x86_64")]
    use std::arch::x86_64::*;
    use std::hint::black_box;

    use super::{AVX2_ACCUMULATORS, AVX512_ACCUMULATORS, ITERATIONS_PER_CHUNK, OFFSET, SCALE, STATE_FLOATS};

    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn chunk_avx512(state: &mut [f32; STATE_FLOATS]) {
        // SAFETY: every load and store stays inside `state` (16 accumulators × 16 lanes); the
        // caller checked the feature.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); AVX512_ACCUMULATORS];
            for (reg, lanes) in acc.iter_mut().zip(state.chunks_exact(16)) {
                *reg = _mm512_loadu_ps(lanes.as_ptr());
            }
            let (scale, offset) = (_mm512_set1_ps(SCALE), _mm512_set1_ps(OFFSET));
            for _ in 0..ITERATIONS_PER_CHUNK {
                for reg in acc.iter_mut() {
                    *reg = _mm512_fmadd_ps(*reg, scale, offset);
                }
            }
            let acc = black_box(acc);
            for (reg, lanes) in acc.iter().zip(state.chunks_exact_mut(16)) {
                _mm512_storeu_ps(lanes.as_mut_ptr(), *reg);
            }
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn chunk_avx2(state: &mut [f32; STATE_FLOATS]) {
        // SAFETY: every load and store stays inside `state` (12 accumulators × 8 lanes); the
        // caller checked the features.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); AVX2_ACCUMULATORS];
            for (reg, lanes) in acc.iter_mut().zip(state.chunks_exact(8)) {
                *reg = _mm256_loadu_ps(lanes.as_ptr());
            }
            let (scale, offset) = (_mm256_set1_ps(SCALE), _mm256_set1_ps(OFFSET));
            for _ in 0..ITERATIONS_PER_CHUNK {
                for reg in acc.iter_mut() {
                    *reg = _mm256_fmadd_ps(*reg, scale, offset);
                }
            }
            let acc = black_box(acc);
            for (reg, lanes) in acc.iter().zip(state.chunks_exact_mut(8)) {
                _mm256_storeu_ps(lanes.as_mut_ptr(), *reg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_positive_peak_quickly() {
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let started = Instant::now();
            let peak = measure_fma_peak(&pool, 20);
            assert!(started.elapsed() < Duration::from_secs(2));
            assert!(peak.gflops > 0.0 && peak.gflops.is_finite(), "{peak:?}");
            assert!(peak.gflops_per_thread > 0.0, "{peak:?}");
            assert_eq!(peak.threads, threads);
            assert!(!peak.isa.is_empty());
        }
    }
}
