//! The few WASI preview-1 calls a proxy-wasm module (or a `wasm32-wasip1` test binary)
//! makes, by hand: a full WASI crate would bring a file system and an async runtime the
//! filter must never touch. Time comes from the virtual clock, randomness is seeded.

use crate::memory::{read, word, write, write_u32, write_u64, Ctx};
use crate::state::HostState;
use std::fmt;
use wasmtime::Linker;

const MODULE: &str = "wasi_snapshot_preview1";
const SUCCESS: i32 = 0;
const EBADF: i32 = 8;
const EFAULT: i32 = 21;
const EINVAL: i32 = 28;
const ESPIPE: i32 = 70;

/// `proc_exit`: the guest asked to stop; carried out of wasmtime as the trap's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcExit(pub i32);

impl fmt::Display for ProcExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "guest called proc_exit({})", self.0)
    }
}

impl std::error::Error for ProcExit {}

fn errno(ok: Option<()>) -> i32 {
    if ok.is_some() {
        SUCCESS
    } else {
        EFAULT
    }
}

/// Writes a NUL-separated list (argv or environ) the way WASI lays it out.
fn write_list(c: &mut Ctx<'_>, list: &[Vec<u8>], ptrs: i32, buf: i32) -> Option<()> {
    let mut at = word(buf);
    for (i, item) in list.iter().enumerate() {
        let slot = i32::try_from(word(ptrs).checked_add(i * 4)?).ok()?;
        write_u32(c, slot, u32::try_from(at).ok()?)?;
        let mut bytes = item.clone();
        bytes.push(0);
        write(c, i32::try_from(at).ok()?, &bytes)?;
        at = at.checked_add(bytes.len())?;
    }
    Some(())
}

fn sizes(list: &[Vec<u8>]) -> (u32, u32) {
    let bytes: usize = list.iter().map(|s| s.len() + 1).sum();
    (list.len() as u32, bytes as u32)
}

pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        MODULE,
        "args_sizes_get",
        |mut c: Ctx<'_>, count: i32, size: i32| -> i32 {
            let (n, bytes) = sizes(&c.data().args);
            errno(write_u32(&mut c, count, n).and_then(|()| write_u32(&mut c, size, bytes)))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "args_get",
        |mut c: Ctx<'_>, ptrs: i32, buf: i32| -> i32 {
            let args = c.data().args.clone();
            errno(write_list(&mut c, &args, ptrs, buf))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "environ_sizes_get",
        |mut c: Ctx<'_>, count: i32, size: i32| -> i32 {
            let (n, bytes) = sizes(&c.data().env);
            errno(write_u32(&mut c, count, n).and_then(|()| write_u32(&mut c, size, bytes)))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "environ_get",
        |mut c: Ctx<'_>, ptrs: i32, buf: i32| -> i32 {
            let env = c.data().env.clone();
            errno(write_list(&mut c, &env, ptrs, buf))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "clock_time_get",
        |mut c: Ctx<'_>, id: i32, _precision: i64, ret: i32| -> i32 {
            let now = match id {
                0 => c.data().now_ns,
                1..=3 => c.data().monotonic_ns,
                _ => return EINVAL,
            };
            errno(write_u64(&mut c, ret, now))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "clock_res_get",
        |mut c: Ctx<'_>, _id: i32, ret: i32| -> i32 { errno(write_u64(&mut c, ret, 1)) },
    )?;
    linker.func_wrap(
        MODULE,
        "random_get",
        |mut c: Ctx<'_>, buf: i32, len: i32| -> i32 {
            let mut bytes = vec![0u8; word(len)];
            let state = c.data_mut();
            for b in &mut bytes {
                // xorshift64: reproducible, which is what a test wants from randomness.
                let mut x = state.random_state;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                state.random_state = x;
                *b = x as u8;
            }
            errno(write(&mut c, buf, &bytes))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "fd_write",
        |mut c: Ctx<'_>, fd: i32, iovs: i32, count: i32, written: i32| -> i32 {
            let mut out = Vec::new();
            for i in 0..word(count) {
                let Some(at) = word(iovs)
                    .checked_add(i * 8)
                    .and_then(|a| i32::try_from(a).ok())
                else {
                    return EFAULT;
                };
                let Some(iov) = read(&mut c, at, 8) else {
                    return EFAULT;
                };
                let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                let Some(bytes) = read(&mut c, ptr, len) else {
                    return EFAULT;
                };
                out.extend_from_slice(&bytes);
            }
            let state = c.data_mut();
            match fd {
                1 => state.stdout.extend_from_slice(&out),
                2 => state.stderr.extend_from_slice(&out),
                _ => return EBADF,
            }
            if state.echo_stdio {
                use std::io::Write;
                let _ = if fd == 1 {
                    std::io::stdout().write_all(&out)
                } else {
                    std::io::stderr().write_all(&out)
                };
            }
            errno(write_u32(&mut c, written, out.len() as u32))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "fd_read",
        |mut c: Ctx<'_>, fd: i32, _iovs: i32, _n: i32, read_ptr: i32| -> i32 {
            if fd != 0 {
                return EBADF;
            }
            errno(write_u32(&mut c, read_ptr, 0))
        },
    )?;
    linker.func_wrap(MODULE, "fd_close", |_c: Ctx<'_>, _fd: i32| -> i32 {
        SUCCESS
    })?;
    linker.func_wrap(
        MODULE,
        "fd_seek",
        |_c: Ctx<'_>, _fd: i32, _off: i64, _w: i32, _ret: i32| -> i32 { ESPIPE },
    )?;
    linker.func_wrap(
        MODULE,
        "fd_fdstat_get",
        |mut c: Ctx<'_>, fd: i32, ret: i32| -> i32 {
            if !(0..=2).contains(&fd) {
                return EBADF;
            }
            // A character device with every right: what a terminal looks like.
            let mut stat = [0u8; 24];
            stat[0] = 2;
            stat[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
            stat[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
            errno(write(&mut c, ret, &stat))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "fd_prestat_get",
        |_c: Ctx<'_>, _fd: i32, _ret: i32| -> i32 { EBADF },
    )?;
    linker.func_wrap(
        MODULE,
        "fd_prestat_dir_name",
        |_c: Ctx<'_>, _fd: i32, _p: i32, _l: i32| -> i32 { EBADF },
    )?;
    linker.func_wrap(MODULE, "sched_yield", |_c: Ctx<'_>| -> i32 { SUCCESS })?;
    linker.func_wrap(
        MODULE,
        "proc_exit",
        |_c: Ctx<'_>, code: i32| -> wasmtime::Result<()> {
            Err(wasmtime::Error::new(ProcExit(code)))
        },
    )?;
    Ok(())
}
