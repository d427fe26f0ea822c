//! Stream control and callouts: resume, close, local replies, `proxy_http_call`, and the
//! context bookkeeping around them (effective context, status, done).

use crate::abi::{decode_pairs, Status};
use crate::callout::{Callout, CalloutState};
use crate::memory::{arg, hand_over, write_u32, Ctx};
use crate::state::{Event, HostState, LocalReply};
use wasmtime::Linker;

fn record(state: &mut HostState, event: Event) -> Status {
    match state.stream_mut() {
        Some(stream) => {
            stream.events.push(event);
            Status::Ok
        }
        None => Status::BadArgument,
    }
}

pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_continue_stream",
        |mut c: Ctx<'_>, t: i32| -> i32 {
            record(c.data_mut(), Event::Resumed { stream_type: t }).code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_close_stream",
        |mut c: Ctx<'_>, t: i32| -> i32 {
            record(c.data_mut(), Event::Closed { stream_type: t }).code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: Ctx<'_>,
         status: i32,
         dp: i32,
         dl: i32,
         bp: i32,
         bl: i32,
         hp: i32,
         hl: i32,
         grpc: i32|
         -> i32 {
            let (details, body, headers) = match (
                arg(&mut c, dp, dl),
                arg(&mut c, bp, bl),
                arg(&mut c, hp, hl),
            ) {
                (Ok(d), Ok(b), Ok(h)) => (d, b, h),
                _ => return Status::InvalidMemoryAccess.code(),
            };
            let Some(headers) = decode_pairs(&headers) else {
                return Status::BadArgument.code();
            };
            let reply = LocalReply {
                status: status as u32,
                details,
                headers,
                body,
                grpc_status: grpc,
            };
            record(c.data_mut(), Event::LocalReply(reply)).code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: Ctx<'_>,
         up: i32,
         ul: i32,
         hp: i32,
         hl: i32,
         bp: i32,
         bl: i32,
         tp: i32,
         tl: i32,
         timeout: i32,
         ret_token: i32|
         -> i32 {
            let args = (
                arg(&mut c, up, ul),
                arg(&mut c, hp, hl),
                arg(&mut c, bp, bl),
                arg(&mut c, tp, tl),
            );
            let (Ok(upstream), Ok(headers), Ok(body), Ok(trailers)) = args else {
                return Status::InvalidMemoryAccess.code();
            };
            let (Some(headers), Some(trailers)) = (decode_pairs(&headers), decode_pairs(&trailers))
            else {
                return Status::BadArgument.code();
            };
            let upstream = String::from_utf8_lossy(&upstream).into_owned();
            let state = c.data_mut();
            if let Some(known) = &state.clusters {
                if !known.contains(&upstream) {
                    state.host_log(format!("proxy_http_call: unknown cluster {upstream:?}"));
                    return Status::BadArgument.code();
                }
            }
            // Envoy refuses a callout without these three pseudo-headers.
            for required in [&b":method"[..], b":path", b":authority"] {
                if !headers.iter().any(|(k, _)| k.as_slice() == required) {
                    state.host_log(format!(
                        "proxy_http_call: missing {}",
                        String::from_utf8_lossy(required)
                    ));
                    return Status::BadArgument.code();
                }
            }
            let token = state.next_token;
            let callout = Callout {
                token,
                context_id: state.effective,
                upstream,
                headers,
                body,
                trailers,
                timeout_ms: timeout as u32,
                dispatched_ns: state.monotonic_ns,
                state: CalloutState::Pending,
            };
            if write_u32(&mut c, ret_token, token).is_none() {
                return Status::InvalidMemoryAccess.code();
            }
            let state = c.data_mut();
            state.next_token += 1;
            state.callouts.push(callout);
            let _ = record(state, Event::Dispatched { token });
            Status::Ok.code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: Ctx<'_>, id: i32| -> i32 {
            let id = id as u32;
            let state = c.data_mut();
            if id == state.root_id || state.streams.get(&id).is_some_and(|s| !s.deleted) {
                state.effective = id;
                Status::Ok.code()
            } else {
                Status::BadArgument.code()
            }
        },
    )?;
    linker.func_wrap("env", "proxy_done", |mut c: Ctx<'_>| -> i32 {
        let state = c.data_mut();
        let id = state.effective;
        state.done_called.push(id);
        Status::Ok.code()
    })?;
    linker.func_wrap(
        "env",
        "proxy_get_status",
        |mut c: Ctx<'_>, code_ptr: i32, msg_ptr: i32, msg_size: i32| -> wasmtime::Result<i32> {
            let (code, message) = c.data().last_status.clone();
            if write_u32(&mut c, code_ptr, code).is_none() {
                return Ok(Status::InvalidMemoryAccess.code());
            }
            // Envoy hands an empty message over as a null pointer: the SDK reads `None`.
            if message.is_empty() {
                let nulls =
                    write_u32(&mut c, msg_ptr, 0).and_then(|()| write_u32(&mut c, msg_size, 0));
                return Ok(match nulls {
                    Some(()) => Status::Ok.code(),
                    None => Status::InvalidMemoryAccess.code(),
                });
            }
            Ok(hand_over(&mut c, &message, msg_ptr, msg_size)?.code())
        },
    )?;
    Ok(())
}
