//! The GPU kernel benches' pieces that need no GPU: FLOPs, records, the sweeps planned on each
//! device, every kernel launched by someone, shape parsing, the check bounds.

use super::*;

fn record(peak: Option<f64>) -> GpuRecord {
    GpuRecord {
        bench: "gemm",
        device_kind: "cuda",
        shape: "4096x4096x4096 NT".into(),
        dtype: "bf16",
        device: "NVIDIA A100-SXM4-80GB".into(),
        achieved: 156.0,
        unit: "TFLOP/s",
        peak,
        ms: 0.881,
        note: "gemm_fwd_bf16".into(),
    }
}

#[test]
fn flops_follow_their_definitions() {
    assert_eq!(gemm_flops(2, 3, 4), 48.0);
    // 8 x 1024 x 12 x 64 causal: 4 · b · h · s² · d / 2.
    assert_eq!(attention_flops(8, 1024, 12, 64), 4.0 * 8.0 * 12.0 * 1024.0 * 1024.0 * 64.0 / 2.0);
}

#[test]
fn records_report_the_fraction_of_peak_or_say_there_is_none() {
    let r = record(Some(312.0));
    assert_eq!(r.fraction(), Some(0.5));
    let j = r.json();
    assert!(
        j.contains("\"peak\": 312.0") && j.contains("\"ratio\": 0.5000") && j.contains("\"unit\": \"TFLOP/s\""),
        "{j}"
    );
    let table = format_records(&[r], false);
    assert!(table.starts_with("device: NVIDIA A100-SXM4-80GB (peaks from the datasheet table)\n"), "{table}");
    assert!(table.lines().nth(2).unwrap().contains("50.0%"), "{table}");
    let unknown = record(None);
    assert_eq!(unknown.fraction(), None);
    assert!(unknown.json().contains("\"peak\": null, \"ratio\": null"), "{}", unknown.json());
    let table = format_records(&[unknown], false);
    assert!(table.contains("not in the peak table") && !table.contains('%'), "{table}");
    assert_eq!(format_records(&[record(Some(1.0)), record(None)], true).lines().count(), 2);
}

/// Every shape of every sweep plans on an A100, an H100 (with the wgmma GEMM) and an MI250X
/// GCD: the launch geometry fits each device and the preconditions hold.
#[test]
fn every_sweep_shape_plans_on_an_a100_an_h100_and_an_mi250x() {
    use crate::gpu::launch::DeviceLimits;
    let mi250x = DeviceLimits { shared_bytes_optin: 64 * 1024, ..DeviceLimits::A100 };
    let devices = [(Vendor::Cuda, "sm_80", DeviceLimits::A100), (Vendor::Cuda, "sm_90a", DeviceLimits::H100)];
    for (vendor, arch, limits) in devices.into_iter().chain([(Vendor::Hip, "gfx90a", mi250x)]) {
        for bench in GpuBench::ALL {
            for shape in bench.shapes() {
                for op in bench.ops(&shape, wgmma(vendor, arch)) {
                    plan(&op, vendor, &limits, 108).unwrap_or_else(|e| panic!("{bench:?} {shape:?}: {e}"));
                }
            }
        }
    }
}

/// Every kernel of the index is launched by the Device or a bench on each vendor that has it (sm_90a's: CUDA only).
#[test]
fn every_kernel_of_the_index_is_launched_by_the_device_or_a_bench() {
    use crate::gpu::device::device_kernels;
    use crate::gpu::kernels::KERNELS;
    for (vendor, archs) in [(Vendor::Cuda, &["sm_80", "sm_90a"][..]), (Vendor::Hip, &["gfx90a"][..])] {
        let mut launched = device_kernels(vendor == Vendor::Cuda);
        for arch in archs {
            for bench in GpuBench::ALL {
                launched.extend(bench.kernels(vendor, arch));
            }
        }
        for k in KERNELS.iter().filter(|k| vendor.threads(k.kernel).is_some()) {
            assert!(
                launched.contains(&k.kernel),
                "{} runs on {vendor:?} in neither the Device nor a bench",
                k.function
            );
        }
        assert!(launched.iter().all(|&k| vendor.threads(k).is_some()), "{vendor:?} launches a kernel it lacks");
    }
    assert_eq!(GpuBench::Gemm.kernels(Vendor::Cuda, "sm_90a"), [Kernel::GemmFwdBf16Sm90]);
    let bwd = |vendor, arch| GpuBench::GemmBwd.kernels(vendor, arch);
    assert_eq!(bwd(Vendor::Cuda, "sm_90a"), [Kernel::GemmBwdInputBf16Bf16outSm90, Kernel::ColumnSumAddBf16]);
    assert_eq!(bwd(Vendor::Hip, "gfx90a"), [Kernel::GemmBwdInputBf16Bf16out, Kernel::ColumnSumAddBf16]);
    assert_eq!(GpuBench::Gemm.kernels(Vendor::Cuda, "sm_89"), [Kernel::GemmFwdBf16]);
    assert_eq!(GpuBench::Gemm.kernels(Vendor::Hip, "gfx942"), [Kernel::GemmFwdBf16]);
}

#[test]
fn benches_are_named_as_the_command_line_names_them_and_shapes_parse() {
    for b in GpuBench::ALL {
        assert_eq!(GpuBench::parse(b.name()), Some(b));
        let first = b.shapes()[0].iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x");
        assert_eq!(parse_shape(&first, b.shapes()[0].len(), b.shape_form()).unwrap(), b.shapes()[0]);
    }
    assert_eq!(GpuBench::parse("step"), None);
    let e = parse_shape("5x96x3", 2, GpuBench::Layernorm.shape_form()).unwrap_err().to_string();
    assert!(e.contains("RxC (rows, channels)"), "{e}");
    // Attention takes a fifth size, the key/value heads, which must divide the heads.
    let gqa = bench_shape(GpuBench::Attention, "1x8192x32x128x8").unwrap();
    assert_eq!(attention_shape(&gqa), AttentionShape::new(1, 8192, 32, 128).grouped(8));
    assert_eq!(attention_shape(&bench_shape(GpuBench::Attention, "8x1024x12x64").unwrap()).kv_heads, 12);
    let e = bench_shape(GpuBench::Attention, "1x64x4x64x3").unwrap_err().to_string();
    assert!(e.contains("3 key/value heads do not divide 4 heads"), "{e}");
    assert!(bench_shape(GpuBench::Gemm, "8x8x8x2").is_err());
}

#[test]
fn outputs_are_bounded_by_the_bf16_rule_or_f32_roundings() {
    assert_eq!(worst(&[1.0, 2.0], &[1.0, 2.0], Bound::F32), 0.0);
    // bf16: 1e-2 + 0.079 |ref|.
    assert!((worst(&[1.089], &[1.0], Bound::Bf16) - 1.0).abs() < 1e-6);
    assert!(worst(&[1.1], &[1.0], Bound::Bf16) > 1.0);
    // f32: 1e-4 of the largest value plus 1e-4 relative.
    assert!(worst(&[100.0, 0.005], &[100.0, 0.0], Bound::F32) < 1.0);
    assert!(worst(&[100.0, 0.02], &[100.0, 0.0], Bound::F32) > 1.0);
}

#[test]
fn the_spot_check_accepts_exact_products_and_rejects_wrong_ones() {
    let (m, n, k) = (3, 2, 4);
    let a = bf16_values(m * k, 5);
    let w = bf16_values(n * k, 6);
    let exact: Vec<f32> = (0..m * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            Bf16::from_f32((0..k).map(|p| a[i * k + p].to_f32() * w[j * k + p].to_f32()).sum()).to_f32()
        })
        .collect();
    assert!(spot_check(&a, &w, &exact, m, n, k) <= 1.0);
    let wrong: Vec<f32> = exact.iter().map(|x| x * 1.5 + 0.5).collect();
    assert!(spot_check(&a, &w, &wrong, m, n, k) > 1.0);
}
