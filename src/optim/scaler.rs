//! Megatron's loss scaling for fp16: the loss (so every gradient) is multiplied by a scale before
//! backward; a step whose gradients overflowed is skipped, and after `hysteresis` such steps in a
//! row the scale halves; after `window` clean steps it doubles. A constant scale never changes.

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaler {
    pub scale: f64,
    pub min_scale: f64,
    pub window: u64,
    pub hysteresis: u32,
    pub dynamic: bool,
    /// Clean steps since the last change.
    pub growth_tracker: u64,
    /// Overflowing steps still tolerated before the scale backs off.
    pub hysteresis_left: u32,
}

impl LossScaler {
    /// Megatron's defaults: initial 2^32, minimum 1, window 1000, hysteresis 2.
    pub fn dynamic(initial: f64, min_scale: f64, window: u64, hysteresis: u32) -> LossScaler {
        LossScaler {
            scale: initial,
            min_scale,
            window,
            hysteresis,
            dynamic: true,
            growth_tracker: 0,
            hysteresis_left: hysteresis,
        }
    }

    pub fn constant(scale: f64) -> LossScaler {
        LossScaler {
            scale,
            min_scale: scale,
            window: u64::MAX,
            hysteresis: 1,
            dynamic: false,
            growth_tracker: 0,
            hysteresis_left: 1,
        }
    }

    /// Records whether this step's gradients overflowed.
    pub fn update(&mut self, found_inf: bool) {
        if !self.dynamic {
            return;
        }
        if found_inf {
            self.growth_tracker = 0;
            self.hysteresis_left = self.hysteresis_left.saturating_sub(1);
            if self.hysteresis_left == 0 {
                self.scale = (self.scale * 0.5).max(self.min_scale);
            }
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == self.window {
                self.growth_tracker = 0;
                self.hysteresis_left = self.hysteresis;
                self.scale *= 2.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hysteresis_then_halving_then_growth() {
        let mut s = LossScaler::dynamic(1024.0, 1.0, 3, 2);
        s.update(true);
        assert_eq!(s.scale, 1024.0, "the first overflow is tolerated");
        s.update(true);
        assert_eq!(s.scale, 512.0);
        s.update(true);
        assert_eq!(s.scale, 256.0, "hysteresis stays spent until the scale grows again");
        for _ in 0..3 {
            s.update(false);
        }
        assert_eq!(s.scale, 512.0);
        assert_eq!(s.hysteresis_left, 2);
        let mut c = LossScaler::constant(8.0);
        c.update(true);
        assert_eq!(c.scale, 8.0);
    }
}
