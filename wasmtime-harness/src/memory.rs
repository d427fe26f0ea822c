//! Guest memory, touched only through bounds-checked copies.
//!
//! A hostile or buggy guest hands the host arbitrary pointers; every access is checked and
//! a bad one becomes Envoy's `InvalidMemoryAccess` status, never a host crash.

use crate::abi::Status;
use crate::state::HostState;
use wasmtime::Caller;

/// The caller's context, named once.
pub type Ctx<'a> = Caller<'a, HostState>;

/// A 32-bit guest pointer or size, read as the unsigned number it is.
pub fn word(value: i32) -> usize {
    value as u32 as usize
}

/// Copies `len` bytes at `ptr` out of the guest; `None` if any of them is out of bounds.
pub fn read(caller: &mut Ctx<'_>, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let memory = caller.data().memory?;
    let start = word(ptr);
    let end = start.checked_add(word(len))?;
    memory.data(&*caller).get(start..end).map(<[u8]>::to_vec)
}

/// Copies `bytes` into the guest at `ptr`; `None` if that runs out of bounds.
pub fn write(caller: &mut Ctx<'_>, ptr: i32, bytes: &[u8]) -> Option<()> {
    let memory = caller.data().memory?;
    let start = word(ptr);
    let end = start.checked_add(bytes.len())?;
    memory
        .data_mut(&mut *caller)
        .get_mut(start..end)?
        .copy_from_slice(bytes);
    Some(())
}

pub fn write_u32(caller: &mut Ctx<'_>, ptr: i32, value: u32) -> Option<()> {
    write(caller, ptr, &value.to_le_bytes())
}

pub fn write_u64(caller: &mut Ctx<'_>, ptr: i32, value: u64) -> Option<()> {
    write(caller, ptr, &value.to_le_bytes())
}

/// Hands `bytes` to the guest as Envoy does: a buffer from the guest's own
/// `proxy_on_memory_allocate`, its address and size written to `ptr_ptr` and `size_ptr`.
/// A trap inside the allocator is passed on (the guest is broken); bad pointers are a status.
pub fn hand_over(
    caller: &mut Ctx<'_>,
    bytes: &[u8],
    ptr_ptr: i32,
    size_ptr: i32,
) -> wasmtime::Result<Status> {
    let Some(allocate) = caller.data().allocate.clone() else {
        return Ok(Status::InternalFailure);
    };
    let Ok(len) = i32::try_from(bytes.len()) else {
        return Ok(Status::InvalidMemoryAccess);
    };
    let addr = allocate.call(&mut *caller, len)?;
    if addr == 0 && len > 0 {
        return Ok(Status::InvalidMemoryAccess);
    }
    let copied = write(caller, addr, bytes)
        .and_then(|()| write_u32(caller, ptr_ptr, addr as u32))
        .and_then(|()| write_u32(caller, size_ptr, len as u32));
    Ok(match copied {
        Some(()) => Status::Ok,
        None => Status::InvalidMemoryAccess,
    })
}

/// Reads guest bytes for a host call, or yields the status Envoy would return.
pub fn arg(caller: &mut Ctx<'_>, ptr: i32, len: i32) -> Result<Vec<u8>, Status> {
    read(caller, ptr, len).ok_or(Status::InvalidMemoryAccess)
}

/// Collapses a host call body into the status code the guest sees.
pub fn code(result: Result<Status, Status>) -> i32 {
    match result {
        Ok(s) | Err(s) => s.code(),
    }
}
