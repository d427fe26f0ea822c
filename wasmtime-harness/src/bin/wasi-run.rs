//! A minimal WASI runner on the harness's wasmtime, usable as the cargo runner of
//! `wasm32-wasip1`, so the unit tests of the filter and of its configuration also run as
//! 32-bit wasm:
//!
//! `CARGO_TARGET_WASM32_WASIP1_RUNNER=target/debug/wasi-run cargo test -p ratelimit-config -p ratelimit-filter --target wasm32-wasip1`
//!
//! Arguments and environment pass through; stdout and stderr are the real ones; the guest's
//! `proc_exit` code becomes this process's exit code.

use std::process::ExitCode;
use wasmtime_harness::{HarnessError, Host, HostState, Wasm};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: wasi-run MODULE.wasm [ARGS...]");
        return ExitCode::from(2);
    };
    let wasm = match Wasm::load(std::path::Path::new(path)) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("wasi-run: {e}");
            return ExitCode::from(2);
        }
    };
    let state = HostState {
        args: args.iter().map(|a| a.clone().into_bytes()).collect(),
        env: std::env::vars()
            .filter(|(k, _)| k.starts_with("RUST_"))
            .map(|(k, v)| format!("{k}={v}").into_bytes())
            .collect(),
        echo_stdio: true,
        // A test binary runs every test in its one `_start`: a callback's budget is a
        // runaway loop's, not a whole suite's.
        fuel_per_call: 50 * wasmtime_harness::state::FUEL_PER_CALLBACK,
        ..HostState::default()
    };
    // A test binary of the filter exports proxy-wasm's `_initialize` as well as `_start`:
    // `Host::with_state` runs the former, `main` is the latter. One without `_initialize`
    // (the configuration's) is a plain command, whose `_start` `with_state` ran already: a
    // second would trap (wasi-libc's `_start` runs once).
    let run =
        Host::with_state(&wasm, state).and_then(|mut host| match host.exports("_initialize") {
            true => host.call::<(), ()>("_start", 0, ()).map(drop),
            false => Ok(()),
        });
    match run {
        Ok(_) | Err(HarnessError::Exit(0)) => ExitCode::SUCCESS,
        Err(HarnessError::Exit(code)) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("wasi-run: {e}");
            ExitCode::from(1)
        }
    }
}
