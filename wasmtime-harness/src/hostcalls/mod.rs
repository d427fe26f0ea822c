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
use wasmtime::{ExternType, Linker, Module, Store};

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
