//! Every hook runs behind `catch_unwind`: a panic that crossed into Envoy would abort the
//! whole process, every worker and connection with it. A caught panic is logged and the
//! hook answers its fallback, which fails that one request the way the configuration's
//! failure mode says (`hooks`). The module is built with unwinding for this (the `module`
//! profile).

use std::panic::{catch_unwind, AssertUnwindSafe};

/// `hook`'s answer, or `fallback` if it panicked.
pub fn guard<T>(name: &str, fallback: impl FnOnce() -> T, hook: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(hook)) {
        Ok(answer) => answer,
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            log::error!("{name} panicked ({why}); its request fails per the failure mode");
            fallback()
        }
    }
}
