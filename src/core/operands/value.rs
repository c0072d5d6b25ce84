//! What a deploy label's value means, and the values the pausing components write.

/// The values the pausing components write into a deploy label: k8s-driver-manager (which
/// appends its to the value it found, after `_`), mig-manager and vgpu-device-manager.
pub const DRIVER_PAUSE: &str = "paused-for-driver-upgrade";
pub const MIG_PAUSE: &str = "paused-for-mig-change";
pub const VGPU_PAUSE: &str = "paused-for-vgpu-change";

/// What a deploy label's value means, to the DaemonSet controller and to the people and
/// components that write it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// Exactly `true`: the only value that schedules the operand.
    On,
    /// Exactly `false`: kept off, and the operator never overwrites it.
    Off,
    /// The empty string: nothing is scheduled (k8s-driver-manager's patches can leave it).
    Empty,
    /// `pre-installed`: k8s-driver-manager saw a driver on the host.
    PreInstalled,
    /// `paused-for-*` or `<value>_paused-for-driver-upgrade`: an upgrade or MIG/vGPU change is running.
    Paused,
    /// A person probably meant "on" (`True`, `yes`, `1`, `enabled`, ` true`), yet it schedules nothing.
    LooksOn,
    /// A person probably meant "off" (`False`, `no`, `0`, `disabled`): off, as intended.
    LooksOff,
    /// Anything else: schedules nothing, and no component writes it.
    Other,
}

impl Value {
    pub fn of(value: &str) -> Value {
        match value {
            "true" => return Value::On,
            "false" => return Value::Off,
            "" => return Value::Empty,
            "pre-installed" => return Value::PreInstalled,
            _ => {}
        }
        if value.starts_with("paused-for-")
            || value
                .strip_suffix(DRIVER_PAUSE)
                .is_some_and(|v| v.ends_with('_'))
        {
            return Value::Paused;
        }
        match value.trim().to_ascii_lowercase().as_str() {
            "true" | "yes" | "y" | "on" | "1" | "enabled" | "enable" => Value::LooksOn,
            "false" | "no" | "n" | "off" | "0" | "disabled" | "disable" => Value::LooksOff,
            _ => Value::Other,
        }
    }

    /// Written by the operator, k8s-driver-manager, mig-manager or vgpu-device-manager themselves.
    pub fn is_component_written(self) -> bool {
        matches!(
            self,
            Value::On | Value::Off | Value::Empty | Value::PreInstalled | Value::Paused
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exact_true_is_on() {
        assert_eq!(Value::of("true"), Value::On);
        for v in ["True", "TRUE", "yes", "1", "enabled", " true", "on"] {
            assert_eq!(Value::of(v), Value::LooksOn, "{v:?}");
        }
        for v in ["False", "no", "0", "disabled"] {
            assert_eq!(Value::of(v), Value::LooksOff, "{v:?}");
        }
    }

    #[test]
    fn component_values_are_recognised() {
        assert_eq!(Value::of("false"), Value::Off);
        assert_eq!(Value::of(""), Value::Empty);
        assert_eq!(Value::of("pre-installed"), Value::PreInstalled);
        assert_eq!(Value::of("paused-for-driver-upgrade"), Value::Paused);
        assert_eq!(Value::of("paused-for-mig-change"), Value::Paused);
        assert_eq!(Value::of("paused-for-vgpu-change"), Value::Paused);
        assert_eq!(
            Value::of("pre-installed_paused-for-driver-upgrade"),
            Value::Paused
        );
        assert_eq!(Value::of("maybe"), Value::Other);
    }
}
