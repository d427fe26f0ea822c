//! gRPC streams: `proxy_grpc_stream`, `proxy_grpc_send`, `proxy_grpc_close` and
//! `proxy_grpc_cancel`, answering with the statuses Envoy 1.40 returns (the SDK panics on
//! any other). Every stream belongs to the root context, whichever context opened it.

use crate::abi::{decode_pairs, Status};
use crate::grpc::GrpcStream;
use crate::memory::{arg, write_u32, Ctx};
use crate::state::HostState;
use wasmtime::Linker;

/// Envoy's token kinds live in the low two bits: HTTP call 0, gRPC call 1, gRPC stream 2.
fn is_stream(token: u32) -> bool {
    token & 3 == 2
}

fn is_call(token: u32) -> bool {
    token & 3 == 1
}

/// `proxy_grpc_close` (a half-close: the upstream may still answer and close) or
/// `proxy_grpc_cancel` (a reset: nothing more arrives).
fn end(state: &mut HostState, token: u32, cancel: bool) -> Status {
    if is_call(token) {
        // gRPC calls are not served, so no call token is ever known.
        return Status::NotFound;
    }
    if !is_stream(token) {
        return Status::BadArgument;
    }
    match state.grpc.held_mut(token) {
        Some(stream) if cancel => stream.guest_cancelled = true,
        Some(stream) => stream.guest_closed = true,
        None => return Status::NotFound,
    }
    Status::Ok
}

/// `proxy_grpc_send`: Envoy accepts any token it still holds; once either end is closed
/// the message goes nowhere, yet the status is `Ok`.
fn send(state: &mut HostState, token: u32, message: Vec<u8>, end_stream: bool) -> Status {
    if !is_stream(token) {
        return Status::BadArgument;
    }
    let Some(stream) = state.grpc.held_mut(token) else {
        return Status::NotFound;
    };
    let writable = stream.writable();
    if writable {
        stream.messages.push(message);
    } else {
        stream.dropped.push(message);
    }
    stream.end_stream_sent |= end_stream;
    if !writable {
        state.host_log(format!(
            "proxy_grpc_send: stream {token} is closed, message dropped"
        ));
    }
    Status::Ok
}

pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_grpc_stream",
        |mut c: Ctx<'_>,
         up: i32,
         ul: i32,
         sp: i32,
         sl: i32,
         mp: i32,
         ml: i32,
         ip: i32,
         il: i32,
         ret_token: i32|
         -> i32 {
            let args = (
                arg(&mut c, up, ul),
                arg(&mut c, sp, sl),
                arg(&mut c, mp, ml),
                arg(&mut c, ip, il),
            );
            let (Ok(upstream), Ok(service), Ok(method), Ok(metadata)) = args else {
                return Status::InvalidMemoryAccess.code();
            };
            let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
            let (upstream, service, method) = (text(upstream), text(service), text(method));
            let state = c.data_mut();
            if let Some(known) = &state.clusters {
                // Envoy first reads `upstream` as a serialized GrpcService, then as a
                // cluster name; an unknown cluster is a ParseFailure.
                if !known.contains(&upstream) {
                    state.host_log(format!("proxy_grpc_stream: unknown cluster {upstream:?}"));
                    return Status::ParseFailure.code();
                }
            }
            // Envoy reads a malformed map as no pairs at all.
            let initial_metadata = decode_pairs(&metadata).unwrap_or_default();
            let token = state.grpc.last_token.wrapping_add(4);
            if write_u32(&mut c, ret_token, token).is_none() {
                return Status::InvalidMemoryAccess.code();
            }
            let state = c.data_mut();
            state.grpc.last_token = token;
            let stream = GrpcStream {
                token,
                context_id: state.effective,
                upstream,
                service,
                method,
                initial_metadata,
                messages: Vec::new(),
                dropped: Vec::new(),
                end_stream_sent: false,
                guest_closed: false,
                guest_cancelled: false,
                remote_close: None,
                initial_metadata_delivered: false,
                forwarded: 0,
            };
            state.grpc.streams.push(stream);
            Status::Ok.code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_send",
        |mut c: Ctx<'_>, token: i32, mp: i32, ml: i32, end_stream: i32| -> i32 {
            match arg(&mut c, mp, ml) {
                Ok(message) => send(c.data_mut(), token as u32, message, end_stream != 0).code(),
                Err(s) => s.code(),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_close",
        |mut c: Ctx<'_>, token: i32| -> i32 { end(c.data_mut(), token as u32, false).code() },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_cancel",
        |mut c: Ctx<'_>, token: i32| -> i32 { end(c.data_mut(), token as u32, true).code() },
    )?;
    Ok(())
}
