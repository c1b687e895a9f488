//! Numerical comparisons the host-device tests share: an analytic gradient against central
//! differences, and an f32 result against the f64 oracle's by the error norm.

/// The step of the central differences.
pub const EPS: f64 = 1e-6;

/// Compares an analytic gradient with central differences of `objective` around `x`, element by
/// element: |analytic - numeric| <= 1e-7 + 1e-6 |numeric|.
pub fn check_gradient(what: &str, x: &mut [f64], analytic: &[f64], objective: &mut dyn FnMut(&[f64]) -> f64) {
    assert_eq!(x.len(), analytic.len(), "{what}");
    assert!(!x.is_empty(), "{what}: no elements checked");
    for i in 0..x.len() {
        let orig = x[i];
        x[i] = orig + EPS;
        let up = objective(x);
        x[i] = orig - EPS;
        let down = objective(x);
        x[i] = orig;
        let numeric = (up - down) / (2.0 * EPS);
        let err = (analytic[i] - numeric).abs();
        assert!(err <= 1e-7 + 1e-6 * numeric.abs(), "{what}[{i}]: analytic {} vs numeric {numeric}", analytic[i]);
    }
}

/// f32 results must match the f64 oracle to within a few f32 roundings of the values involved:
/// the error norm is at most `rel` times the reference norm.
pub fn assert_close(what: &str, fast: &[f32], oracle: &[f32], rel: f64) {
    assert_eq!(fast.len(), oracle.len(), "{what}: lengths");
    let err: f64 = fast.iter().zip(oracle).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
    let norm: f64 = oracle.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
    assert!(err <= rel * norm.max(1e-30), "{what}: error norm {err} vs reference norm {norm}");
}
