//! The host functions, one file per family, and the import check that names what the
//! harness does not serve before the guest ever runs.

mod grpc;
mod http;
mod maps;
mod misc;
mod queue;
mod redis;
pub mod wasi;

use crate::state::HostState;
use wasmtime::{Extern, ExternType, Linker, Module, Store, Val};

/// Every host function the harness serves, proxy-wasm (but gRPC calls and foreign
/// functions), WASI and redis-call.
pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    maps::link(linker)?;
    http::link(linker)?;
    grpc::link(linker)?;
    misc::link(linker)?;
    queue::link(linker)?;
    wasi::link(linker)?;
    redis::link(linker)
}

/// Names (`module.name`) of the module's imports the linker does not serve, after giving
/// each unserved function a stub that traps with its name if the guest ever calls it.
pub fn stub_unserved(
    linker: &mut Linker<HostState>,
    store: &mut Store<HostState>,
    module: &Module,
) -> wasmtime::Result<Vec<String>> {
    let mut unserved = Vec::new();
    for import in module.imports() {
        if linker.get_by_import(&mut *store, &import).is_some() {
            continue;
        }
        let name = format!("{}.{}", import.module(), import.name());
        if let ExternType::Func(ty) = import.ty() {
            let message = format!("host call {name} is not served by wasmtime-harness");
            linker.func_new(import.module(), import.name(), ty, move |_, _, _| {
                Err(wasmtime::Error::msg(message.clone()))
            })?;
        }
        unserved.push(name);
    }
    Ok(unserved)
}

/// Wraps every proxy-wasm host call the module imports so that while `HostState::refused`
/// names it, it answers that status without running: a test can hold the guest to
/// surviving any status from any call (the SDK's wrappers panic on one they do not expect,
/// and real hosts differ in what they answer).
pub fn make_refusable(
    linker: &mut Linker<HostState>,
    store: &mut Store<HostState>,
    module: &Module,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    for import in module.imports() {
        let (Some(Extern::Func(served)), ExternType::Func(ty)) =
            (linker.get_by_import(&mut *store, &import), import.ty())
        else {
            continue;
        };
        // Every proxy-wasm call answers a status (one i32); WASI and the rest are left be.
        let answers_status = ty.results().len() == 1;
        if import.module() != "env" || !import.name().starts_with("proxy_") || !answers_status {
            continue;
        }
        let name = import.name().to_string();
        linker.func_new(
            import.module(),
            import.name(),
            ty,
            move |mut caller, params, results| match (
                caller.data().refused.get(&name),
                results.first_mut(),
            ) {
                (Some(status), Some(result)) => {
                    *result = Val::I32(status.code());
                    Ok(())
                }
                _ => served.call(&mut caller, params, results),
            },
        )?;
    }
    linker.allow_shadowing(false);
    Ok(())
}
