//! The device smoke test behind `make gpu-check` (`trident check gpu`): on a real GPU, compile a
//! small kernel with NVRTC for the device's architecture (through the module cache), load it with
//! `cuModuleLoadData`, launch it over a ragged size, copy the result back and compare it with the
//! host's, exactly; then create the CUDA Device there and compare its ops with the reference
//! device (`device_ops`).

use super::cache::ModuleCache;
use super::driver::{DeviceBuffer, Driver, Module, PrimaryContext};
use super::launch;
use super::nvrtc::Nvrtc;
use crate::error::{Error, Result};
use std::ffi::c_void;

/// `y = a * x + y` over `n` floats, one thread per element.
pub const AXPY_SOURCE: &str = r#"
extern "C" __global__ void trident_smoke_axpy(float a, const float* x, float* y, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;
pub const AXPY_NAME: &str = "trident_smoke_axpy";

/// What the smoke test did, for its report line.
pub struct SmokeReport {
    pub device: String,
    pub arch: String,
    pub elements: usize,
    pub blocks: u64,
    pub cache: String,
}

/// Runs the smoke test on device `ordinal`.
pub fn run(driver: &Driver, nvrtc: &Nvrtc, cache: &ModuleCache, ordinal: usize) -> Result<SmokeReport> {
    let info = driver.device_info(ordinal)?;
    let arch = info.arch();
    let image = cache.get_or_compile(nvrtc, AXPY_NAME, AXPY_SOURCE, &arch, &[])?;
    let context = PrimaryContext::retain(driver, ordinal)?;
    let module = Module::load(&context, &image.bytes)?;
    let function = module.function(AXPY_NAME)?;

    // A ragged size (not a multiple of the block) so the guard of the last block is exercised;
    // small integers keep a * x + y exact in f32.
    let n: usize = (1 << 20) + 3;
    let a = 2.0f32;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let bytes = n * 4;
    let dx = DeviceBuffer::alloc(&context, bytes)?;
    let dy = DeviceBuffer::alloc(&context, bytes)?;
    dx.upload(bytemuck::cast_slice(&x))?;
    dy.upload(bytemuck::cast_slice(&y))?;
    let cfg = launch::elementwise(AXPY_NAME, n, 256, &info.limits)?;
    let (mut pa, mut px, mut py, mut pn) = (a, dx.pointer, dy.pointer, n as u64);
    let mut params: [*mut c_void; 4] = [
        (&mut pa as *mut f32).cast(),
        (&mut px as *mut u64).cast(),
        (&mut py as *mut u64).cast(),
        (&mut pn as *mut u64).cast(),
    ];
    // SAFETY: the function takes (float, const float*, float*, unsigned long long), matched by
    // the four parameter pointers, which outlive the launch (synchronized below); the geometry
    // was checked against the device's limits.
    let status = unsafe {
        driver.api.cuLaunchKernel(
            function,
            cfg.grid[0],
            cfg.grid[1],
            cfg.grid[2],
            cfg.block[0],
            cfg.block[1],
            cfg.block[2],
            cfg.shared_bytes,
            std::ptr::null_mut(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }?;
    driver.check("cuLaunchKernel", status)?;
    context.synchronize()?;
    let mut out = vec![0f32; n];
    dy.download(bytemuck::cast_slice_mut(&mut out))?;
    if let Some(i) = (0..n).find(|&i| out[i] != a * x[i] + y[i]) {
        return Err(Error::Data(format!(
            "gpu check: {AXPY_NAME} on device {ordinal} ({}) computed y[{i}] = {}, expected {}",
            info.name,
            out[i],
            a * x[i] + y[i]
        )));
    }
    let cache = match image.outcome {
        super::cache::Outcome::Hit => format!("cached {}", image.path.display()),
        _ => format!("compiled by NVRTC, stored in {}", image.path.display()),
    };
    Ok(SmokeReport { device: info.name, arch, elements: n, blocks: cfg.blocks(), cache })
}

/// The CUDA Device's ops against the reference device on device `ordinal`, on small ragged shapes
/// with inputs already rounded to bf16 where the kernels round them: linear forward and backward,
/// attention forward and backward (head dim 64), LayerNorm forward and backward, the
/// cross-entropy pieces and AdamW. Returns how many ops were compared and the largest error
/// relative to the tolerance (below 1 passes); an op outside its tolerance is an error naming it.
pub fn device_ops(ordinal: usize) -> Result<(usize, f64)> {
    use crate::device::reference::ReferenceDevice;
    use crate::device::{AdamWStep, AttentionShape, Device};
    use crate::real::Precision;
    let dev = super::device::GpuDevice::cuda(ordinal)?;
    dev.set_matmul_precision(Precision::Bf16);
    let r = ReferenceDevice;
    // Deterministic inputs: a small linear congruential sequence in [-scale, scale), rounded to bf16.
    let values = |n: usize, seed: u64, scale: f32| -> Vec<f32> {
        let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                Precision::Bf16.round(((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
            })
            .collect()
    };
    let up = |h: &[f32]| {
        let mut b = dev.alloc(h.len());
        dev.upload(&mut b, h);
        b
    };
    let down = |b: &<super::device::GpuDevice as Device>::Buf| {
        let mut h = vec![0f32; dev.len(b)];
        dev.download(b, &mut h);
        h
    };
    let f64s = |h: &[f32]| h.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let mut worst = 0.0f64;
    let mut compared = 0;
    // |got - want| <= atol + rtol |want|, atol relative to the largest |want|.
    let mut compare = |what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64| -> Result<()> {
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let bound = atol * scale.max(1e-30) + rtol * w.abs();
            let ratio = (g as f64 - w).abs() / bound;
            if ratio.is_nan() || ratio > 1.0 {
                return Err(Error::Data(format!(
                    "gpu check: device {ordinal}: {what}: element {i} is {g}, the reference {w} (tolerance {bound:.2e})"
                )));
            }
            worst = worst.max(ratio);
        }
        compared += 1;
        Ok(())
    };
    let (f32_tol, bf16_tol) = ((1e-4, 1e-4), (1e-2, 0.079));

    let (rows, k, n) = (37, 64, 96);
    let (x, w, b, dy) = (values(rows * k, 1, 1.0), values(n * k, 2, 0.2), values(n, 3, 0.5), values(rows * n, 4, 1.0));
    let mut out = dev.alloc(rows * n);
    dev.linear_forward(&mut out, &up(&x), &up(&w), Some(&up(&b)), rows, k, n);
    let mut want = r.alloc(rows * n);
    r.linear_forward(&mut want, &f64s(&x), &f64s(&w), Some(&f64s(&b)), rows, k, n);
    compare("linear_forward", &down(&out), &want, f32_tol.0, f32_tol.1)?;
    let (mut dx, mut dw, mut db) = (dev.alloc(rows * k), dev.alloc(n * k), dev.alloc(n));
    dev.linear_backward(Some(&mut dx), &mut dw, Some(&mut db), &up(&dy), &up(&x), &up(&w), rows, k, n);
    let (mut rdx, mut rdw, mut rdb) = (r.alloc(rows * k), r.alloc(n * k), r.alloc(n));
    r.linear_backward(Some(&mut rdx), &mut rdw, Some(&mut rdb), &f64s(&dy), &f64s(&x), &f64s(&w), rows, k, n);
    compare("linear_backward dinp", &down(&dx), &rdx, f32_tol.0, f32_tol.1)?;
    compare("linear_backward dweight", &down(&dw), &rdw, f32_tol.0, f32_tol.1)?;
    compare("linear_backward dbias", &down(&db), &rdb, f32_tol.0, f32_tol.1)?;

    let shape = AttentionShape { batch: 1, seq: 70, heads: 2, head_dim: 64 };
    let (arows, width) = (shape.rows(), shape.width());
    let (qkv, dout) = (values(3 * arows * width, 5, 1.0), values(arows * width, 6, 1.0));
    let (mut o, mut lse) = (dev.alloc(arows * width), dev.alloc(arows * shape.heads));
    dev.attention_forward(&mut o, &mut lse, &up(&qkv), shape);
    let (mut ro, mut rlse) = (r.alloc(arows * width), r.alloc(arows * shape.heads));
    r.attention_forward(&mut ro, &mut rlse, &f64s(&qkv), shape);
    compare("attention_forward out", &down(&o), &ro, bf16_tol.0, bf16_tol.1)?;
    compare("attention_forward lse", &down(&lse), &rlse, f32_tol.0, f32_tol.1)?;
    let mut dqkv = dev.alloc(3 * arows * width);
    dev.attention_backward(&mut dqkv, &up(&dout), &up(&qkv), &o, &lse, shape);
    let mut rdqkv = r.alloc(3 * arows * width);
    r.attention_backward(&mut rdqkv, &f64s(&dout), &f64s(&qkv), &f64s(&down(&o)), &f64s(&down(&lse)), shape);
    compare("attention_backward", &down(&dqkv), &rdqkv, bf16_tol.0, bf16_tol.1)?;

    let (lrows, cols) = (13, 200);
    let (lx, lw, lb, ldy) =
        (values(lrows * cols, 7, 2.0), values(cols, 8, 1.0), values(cols, 9, 0.5), values(lrows * cols, 10, 1.0));
    let (mut lo, mut mean, mut rstd) = (dev.alloc(lrows * cols), dev.alloc(lrows), dev.alloc(lrows));
    dev.layernorm_forward(&mut lo, &mut mean, &mut rstd, &up(&lx), &up(&lw), &up(&lb), lrows, cols);
    let (mut rlo, mut rmean, mut rrstd) = (r.alloc(lrows * cols), r.alloc(lrows), r.alloc(lrows));
    r.layernorm_forward(&mut rlo, &mut rmean, &mut rrstd, &f64s(&lx), &f64s(&lw), &f64s(&lb), lrows, cols);
    compare("layernorm_forward", &down(&lo), &rlo, f32_tol.0, f32_tol.1)?;
    let (mut ldx, mut ldw, mut ldb) = (dev.alloc(lrows * cols), dev.alloc(cols), dev.alloc(cols));
    dev.layernorm_backward(&mut ldx, &mut ldw, &mut ldb, &up(&ldy), &up(&lx), &up(&lw), &mean, &rstd, lrows, cols);
    let (mut rldx, mut rldw, mut rldb) = (r.alloc(lrows * cols), r.alloc(cols), r.alloc(cols));
    r.layernorm_backward(
        &mut rldx,
        &mut rldw,
        &mut rldb,
        &f64s(&ldy),
        &f64s(&lx),
        &f64s(&lw),
        &rmean,
        &rrstd,
        lrows,
        cols,
    );
    compare("layernorm_backward dinp", &down(&ldx), &rldx, f32_tol.0, f32_tol.1)?;
    compare("layernorm_backward dweight", &down(&ldw), &rldw, f32_tol.0, f32_tol.1)?;

    let (xrows, vocab) = (5, 333);
    let logits = values(xrows * vocab, 11, 4.0);
    let targets: Vec<u32> = (0..xrows as u32).map(|i| i * 61 % vocab as u32).collect();
    let (mut max, mut rmax) = (vec![0f64; xrows], vec![0f64; xrows]);
    let gl = up(&logits);
    dev.cross_entropy_max(&gl, xrows, vocab, &mut max);
    r.cross_entropy_max(&f64s(&logits), xrows, vocab, &mut rmax);
    let (mut se, mut tl, mut rse, mut rtl) =
        (vec![0f64; xrows], vec![0f64; xrows], vec![0f64; xrows], vec![0f64; xrows]);
    dev.cross_entropy_partials(&gl, &targets, 0, xrows, vocab, &max, &mut se, &mut tl);
    r.cross_entropy_partials(&f64s(&logits), &targets, 0, xrows, vocab, &rmax, &mut rse, &mut rtl);
    let as_f32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    compare("cross_entropy_max", &as_f32(&max), &rmax, f32_tol.0, f32_tol.1)?;
    compare("cross_entropy_partials sum_exp", &as_f32(&se), &rse, f32_tol.0, f32_tol.1)?;
    compare("cross_entropy_partials target", &as_f32(&tl), &rtl, f32_tol.0, f32_tol.1)?;

    let m = 1000;
    let (p, g) = (values(m, 12, 1.0), values(m, 13, 0.1));
    let step = AdamWStep { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 1, grad_scale: 1.0 };
    let (mut gp, mut gm, mut gv) = (up(&p), dev.alloc(m), dev.alloc(m));
    dev.adamw(&mut gp, &up(&g), &mut gm, &mut gv, step);
    let (mut rp, mut rm, mut rv) = (f64s(&p), r.alloc(m), r.alloc(m));
    r.adamw(&mut rp, &f64s(&g), &mut rm, &mut rv, step);
    compare("adamw", &down(&gp), &rp, f32_tol.0, f32_tol.1)?;
    Ok((compared, worst))
}
