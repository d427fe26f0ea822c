//! Logging, clocks, ticks, properties, shared data and metrics: the host services a filter
//! uses beside the request itself.

use crate::abi::{property_path, LogLevel, Status};
use crate::memory::{arg, code, hand_over, write_u32, write_u64, Ctx};
use crate::state::{HostState, LogLine, Metric};
use wasmtime::Linker;

pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_log",
        |mut c: Ctx<'_>, level: i32, p: i32, l: i32| -> i32 {
            let message = match arg(&mut c, p, l) {
                Ok(m) => String::from_utf8_lossy(&m).into_owned(),
                Err(s) => return s.code(),
            };
            let Some(level) = LogLevel::from_code(level) else {
                return Status::BadArgument.code();
            };
            let state = c.data_mut();
            let context_id = state.effective;
            state.logs.push(LogLine {
                level,
                context_id,
                message,
            });
            Status::Ok.code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut c: Ctx<'_>, ret: i32| -> i32 {
            let level = c.data().log_level as u32;
            code(
                write_u32(&mut c, ret, level)
                    .map(|()| Status::Ok)
                    .ok_or(Status::InvalidMemoryAccess),
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: Ctx<'_>, ret: i32| -> i32 {
            let now = c.data().now_ns;
            code(
                write_u64(&mut c, ret, now)
                    .map(|()| Status::Ok)
                    .ok_or(Status::InvalidMemoryAccess),
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: Ctx<'_>, ms: i32| -> i32 {
            let state = c.data_mut();
            state.tick_period_ms = ms as u32;
            state.next_tick_ns = (ms != 0).then(|| {
                state
                    .now_ns
                    .saturating_add(u64::from(ms as u32) * 1_000_000)
            });
            Status::Ok.code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: Ctx<'_>, p: i32, l: i32, ret_ptr: i32, ret_size: i32| -> wasmtime::Result<i32> {
            let path = match arg(&mut c, p, l) {
                Ok(p) => property_path(&p),
                Err(s) => return Ok(s.code()),
            };
            match c.data().property(&path) {
                Some(value) => Ok(hand_over(&mut c, &value, ret_ptr, ret_size)?.code()),
                None => Ok(Status::NotFound.code()),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: Ctx<'_>, p: i32, l: i32, vp: i32, vl: i32| -> i32 {
            let (path, value) = match (arg(&mut c, p, l), arg(&mut c, vp, vl)) {
                (Ok(p), Ok(v)) => (property_path(&p), v),
                _ => return Status::InvalidMemoryAccess.code(),
            };
            let state = c.data_mut();
            match state.stream_mut() {
                Some(stream) => stream.properties.insert(path, value),
                None => state.properties.insert(path, value),
            };
            Status::Ok.code()
        },
    )?;
    link_shared(linker)?;
    link_metrics(linker)
}

fn link_shared(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: Ctx<'_>,
         kp: i32,
         kl: i32,
         ret_ptr: i32,
         ret_size: i32,
         ret_cas: i32|
         -> wasmtime::Result<i32> {
            let key = match arg(&mut c, kp, kl) {
                Ok(k) => k,
                Err(s) => return Ok(s.code()),
            };
            let Some((value, cas)) = c.data().shared.get(&key).cloned() else {
                return Ok(Status::NotFound.code());
            };
            if write_u32(&mut c, ret_cas, cas).is_none() {
                return Ok(Status::InvalidMemoryAccess.code());
            }
            Ok(hand_over(&mut c, &value, ret_ptr, ret_size)?.code())
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: Ctx<'_>, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32| -> i32 {
            let (key, value) = match (arg(&mut c, kp, kl), arg(&mut c, vp, vl)) {
                (Ok(k), Ok(v)) => (k, v),
                _ => return Status::InvalidMemoryAccess.code(),
            };
            set_shared(c.data_mut(), key, value, cas as u32).code()
        },
    )?;
    Ok(())
}

/// Envoy's compare-and-swap: a non-zero `cas` must match the key's current one.
pub fn set_shared(state: &mut HostState, key: Vec<u8>, value: Vec<u8>, cas: u32) -> Status {
    let next = state
        .shared
        .values()
        .map(|(_, c)| *c)
        .max()
        .unwrap_or(0)
        .wrapping_add(1)
        .max(1);
    if let Some((_, current)) = state.shared.get(&key) {
        if cas != 0 && cas != *current {
            return Status::CasMismatch;
        }
    }
    state.shared.insert(key, (value, next));
    Status::Ok
}

fn metric(state: &mut HostState, id: i32) -> Option<&mut Metric> {
    state
        .metrics
        .get_mut(usize::try_from(id).ok()?.checked_sub(1)?)
}

fn link_metrics(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: Ctx<'_>, kind: i32, np: i32, nl: i32, ret: i32| -> i32 {
            let name = match arg(&mut c, np, nl) {
                Ok(n) => String::from_utf8_lossy(&n).into_owned(),
                Err(s) => return s.code(),
            };
            if !(0..=2).contains(&kind) {
                return Status::BadArgument.code();
            }
            let metrics = &mut c.data_mut().metrics;
            // Envoy hands back the same id when a name is defined again.
            let index = match metrics
                .iter()
                .position(|m| m.name == name && m.kind == kind)
            {
                Some(i) => i,
                None => {
                    metrics.push(Metric {
                        kind,
                        name,
                        value: 0,
                        recorded: Vec::new(),
                    });
                    metrics.len() - 1
                }
            };
            let id = (index + 1) as u32;
            code(
                write_u32(&mut c, ret, id)
                    .map(|()| Status::Ok)
                    .ok_or(Status::InvalidMemoryAccess),
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: Ctx<'_>, id: i32, by: i64| -> i32 {
            let Some(m) = metric(c.data_mut(), id) else {
                return Status::NotFound.code();
            };
            match (m.kind, by < 0) {
                (2, _) | (0, true) => Status::BadArgument.code(),
                _ => {
                    m.value = m.value.saturating_add_signed(by);
                    Status::Ok.code()
                }
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_record_metric",
        |mut c: Ctx<'_>, id: i32, value: i64| -> i32 {
            let Some(m) = metric(c.data_mut(), id) else {
                return Status::NotFound.code();
            };
            let value = value as u64;
            if m.kind == 2 {
                m.recorded.push(value);
            } else {
                m.value = value;
            }
            Status::Ok.code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: Ctx<'_>, id: i32, ret: i32| -> i32 {
            let value = match metric(c.data_mut(), id) {
                Some(m) if m.kind != 2 => m.value,
                Some(_) => return Status::BadArgument.code(),
                None => return Status::NotFound.code(),
            };
            code(
                write_u64(&mut c, ret, value)
                    .map(|()| Status::Ok)
                    .ok_or(Status::InvalidMemoryAccess),
            )
        },
    )?;
    Ok(())
}
