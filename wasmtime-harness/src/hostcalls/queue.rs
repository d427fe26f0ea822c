//! Shared queues: `proxy_register_shared_queue`, `proxy_resolve_shared_queue`,
//! `proxy_enqueue_shared_queue` and `proxy_dequeue_shared_queue`, with the statuses Envoy
//! 1.40 returns (the SDK panics on any other). The queues and the notifications an enqueue
//! posts live in `crate::queue`.

use crate::abi::Status;
use crate::memory::{arg, hand_over, write_u32, Ctx};
use crate::state::HostState;
use wasmtime::Linker;

/// The VM id queues are named under: Envoy's `vm_id`, which `plugin_vm_id` reports.
fn vm_id(state: &HostState) -> String {
    let key = vec![b"plugin_vm_id".to_vec()];
    let id = state.properties.get(&key).map(|v| v.as_slice());
    String::from_utf8_lossy(id.unwrap_or_default()).into_owned()
}

/// The root context of the running one: `proxy_on_queue_ready` goes to a root.
fn root_of_effective(state: &HostState) -> u32 {
    if state.streams.contains_key(&state.effective) {
        state.root_id
    } else {
        state.effective
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes `token` for the guest: `Ok`, or `InvalidMemoryAccess` (the work is done anyway,
/// as in Envoy).
fn hand_token(c: &mut Ctx<'_>, ptr: i32, token: u32) -> i32 {
    match write_u32(c, ptr, token) {
        Some(()) => Status::Ok.code(),
        None => Status::InvalidMemoryAccess.code(),
    }
}

pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: Ctx<'_>, np: i32, nl: i32, ret_token: i32| -> i32 {
            let name = match arg(&mut c, np, nl) {
                Ok(n) => text(&n),
                Err(s) => return s.code(),
            };
            let state = c.data_mut();
            let (vm_id, root) = (vm_id(state), root_of_effective(state));
            let token = state.queues.register(&vm_id, &name, root);
            hand_token(&mut c, ret_token, token)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: Ctx<'_>, vp: i32, vl: i32, np: i32, nl: i32, ret_token: i32| -> i32 {
            let (Ok(vm_id), Ok(name)) = (arg(&mut c, vp, vl), arg(&mut c, np, nl)) else {
                return Status::InvalidMemoryAccess.code();
            };
            match c.data().queues.resolve(&text(&vm_id), &text(&name)) {
                Some(token) => hand_token(&mut c, ret_token, token),
                None => Status::NotFound.code(),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut c: Ctx<'_>, token: i32, dp: i32, dl: i32| -> i32 {
            let data = match arg(&mut c, dp, dl) {
                Ok(d) => d,
                Err(s) => return s.code(),
            };
            if c.data_mut().queues.enqueue(token as u32, data) {
                Status::Ok.code()
            } else {
                Status::NotFound.code()
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: Ctx<'_>, token: i32, ret_ptr: i32, ret_size: i32| -> wasmtime::Result<i32> {
            let Some(queue) = c.data_mut().queues.get_mut(token as u32) else {
                return Ok(Status::NotFound.code());
            };
            // Envoy pops the item before copying it out, so a bad pointer loses it.
            let Some(item) = queue.items.pop_front() else {
                return Ok(Status::Empty.code());
            };
            Ok(hand_over(&mut c, &item, ret_ptr, ret_size)?.code())
        },
    )?;
    Ok(())
}
