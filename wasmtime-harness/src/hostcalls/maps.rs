//! Header maps and buffers: what the filter reads and changes on a request, and how the
//! callout's reply reaches it. Statuses follow Envoy's `Context::getHeaderMapValue` & co:
//! a map that does not exist right now is `BadArgument`, a missing key `NotFound`.

use crate::abi::{decode_pairs, encode_pairs, BufferType, MapType, Pair, Status};
use crate::memory::{arg, code, hand_over, word, write_u32, Ctx};
use crate::state::{Event, HeaderOp, HostState};
use wasmtime::Linker;

fn map(state: &HostState, code: i32) -> Result<&Vec<Pair>, Status> {
    let map = MapType::from_code(code).ok_or(Status::BadArgument)?;
    let found = match map {
        MapType::CallResponseHeaders => state.call_response.as_ref().map(|r| &r.headers),
        MapType::CallResponseTrailers => state.call_response.as_ref().map(|r| &r.trailers),
        MapType::GrpcInitialMetadata => state.grpc.initial_metadata.as_ref(),
        MapType::GrpcTrailingMetadata => state.grpc.trailing_metadata.as_ref(),
        other => state.stream().and_then(|s| s.map(other)),
    };
    found.ok_or(Status::BadArgument)
}

/// Applies a mutation to a stream map (call reply maps are read-only, as in Envoy).
fn mutate(
    state: &mut HostState,
    code: i32,
    op: HeaderOp,
    name: &[u8],
    value: &[u8],
    change: impl FnOnce(&mut Vec<Pair>),
) -> Status {
    let Some(map) = MapType::from_code(code) else {
        return Status::BadArgument;
    };
    let Some(stream) = state.stream_mut() else {
        return Status::BadArgument;
    };
    let Some(pairs) = stream.map_mut(map) else {
        return Status::BadArgument;
    };
    change(pairs);
    stream.events.push(Event::HeaderChange {
        map,
        op,
        name: name.to_vec(),
        value: value.to_vec(),
    });
    Status::Ok
}

fn lower(bytes: Vec<u8>) -> Vec<u8> {
    bytes.to_ascii_lowercase()
}

pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: Ctx<'_>, m: i32, ret_ptr: i32, ret_size: i32| -> wasmtime::Result<i32> {
            // Envoy stores names lower-cased, whatever the client sent.
            let bytes = match map(c.data(), m) {
                Ok(pairs) => encode_pairs(
                    &pairs
                        .iter()
                        .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                        .collect::<Vec<_>>(),
                ),
                Err(s) => return Ok(s.code()),
            };
            Ok(hand_over(&mut c, &bytes, ret_ptr, ret_size)?.code())
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_size",
        |mut c: Ctx<'_>, m: i32, ret_size: i32| -> i32 {
            let size = match map(c.data(), m) {
                Ok(pairs) => encode_pairs(pairs).len() as u32,
                Err(s) => return s.code(),
            };
            code(
                write_u32(&mut c, ret_size, size)
                    .map(|()| Status::Ok)
                    .ok_or(Status::InvalidMemoryAccess),
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: Ctx<'_>,
         m: i32,
         kp: i32,
         kl: i32,
         ret_ptr: i32,
         ret_size: i32|
         -> wasmtime::Result<i32> {
            let key = match arg(&mut c, kp, kl) {
                Ok(k) => lower(k),
                Err(s) => return Ok(s.code()),
            };
            let value = match map(c.data(), m) {
                Ok(pairs) => match pairs.iter().find(|(k, _)| k.eq_ignore_ascii_case(&key)) {
                    Some((_, v)) => v.clone(),
                    None => return Ok(Status::NotFound.code()),
                },
                Err(s) => return Ok(s.code()),
            };
            Ok(hand_over(&mut c, &value, ret_ptr, ret_size)?.code())
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: Ctx<'_>, m: i32, kp: i32, kl: i32, vp: i32, vl: i32| -> i32 {
            let (key, value) = match (arg(&mut c, kp, kl), arg(&mut c, vp, vl)) {
                (Ok(k), Ok(v)) => (lower(k), v),
                _ => return Status::InvalidMemoryAccess.code(),
            };
            let pair = (key.clone(), value.clone());
            mutate(c.data_mut(), m, HeaderOp::Add, &key, &value, |p| {
                p.push(pair)
            })
            .code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: Ctx<'_>, m: i32, kp: i32, kl: i32, vp: i32, vl: i32| -> i32 {
            let (key, value) = match (arg(&mut c, kp, kl), arg(&mut c, vp, vl)) {
                (Ok(k), Ok(v)) => (lower(k), v),
                _ => return Status::InvalidMemoryAccess.code(),
            };
            let (k2, v2) = (key.clone(), value.clone());
            mutate(
                c.data_mut(),
                m,
                HeaderOp::Replace,
                &key,
                &value,
                move |pairs| {
                    // Envoy's setCopy: every existing value goes, one new value stays.
                    let at = pairs.iter().position(|(k, _)| k.eq_ignore_ascii_case(&k2));
                    pairs.retain(|(k, _)| !k.eq_ignore_ascii_case(&k2));
                    let at = at.unwrap_or(pairs.len()).min(pairs.len());
                    pairs.insert(at, (k2, v2));
                },
            )
            .code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: Ctx<'_>, m: i32, kp: i32, kl: i32| -> i32 {
            let key = match arg(&mut c, kp, kl) {
                Ok(k) => lower(k),
                Err(s) => return s.code(),
            };
            let k2 = key.clone();
            mutate(c.data_mut(), m, HeaderOp::Remove, &key, b"", move |pairs| {
                pairs.retain(|(k, _)| !k.eq_ignore_ascii_case(&k2));
            })
            .code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: Ctx<'_>, m: i32, p: i32, l: i32| -> i32 {
            let bytes = match arg(&mut c, p, l) {
                Ok(b) => b,
                Err(s) => return s.code(),
            };
            let Some(new) = decode_pairs(&bytes) else {
                return Status::BadArgument.code();
            };
            let new: Vec<Pair> = new.into_iter().map(|(k, v)| (lower(k), v)).collect();
            mutate(
                c.data_mut(),
                m,
                HeaderOp::SetAll,
                b"",
                &bytes,
                move |pairs| *pairs = new,
            )
            .code()
        },
    )?;
    link_buffers(linker)
}

fn buffer(state: &HostState, code: i32) -> Result<&[u8], Status> {
    let kind = BufferType::from_code(code).ok_or(Status::BadArgument)?;
    let found = match kind {
        BufferType::RequestBody => state.stream().map(|s| s.request_body.as_slice()),
        BufferType::ResponseBody => state.stream().map(|s| s.response_body.as_slice()),
        BufferType::CallResponseBody => state.call_response.as_ref().map(|r| r.body.as_slice()),
        BufferType::VmConfiguration => Some(state.vm_config.as_slice()),
        BufferType::PluginConfiguration => Some(state.plugin_config.as_slice()),
        BufferType::RedisCallResponse => state.redis.reply.as_deref(),
        BufferType::GrpcReceive => state.grpc.receive.as_deref(),
        _ => None,
    };
    found.ok_or(Status::NotFound)
}

fn link_buffers(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: Ctx<'_>,
         t: i32,
         start: i32,
         max: i32,
         ret_ptr: i32,
         ret_size: i32|
         -> wasmtime::Result<i32> {
            let bytes = match buffer(c.data(), t) {
                Ok(b) => b,
                Err(s) => return Ok(s.code()),
            };
            let (start, max) = (word(start), word(max));
            if start > bytes.len() {
                return Ok(Status::BadArgument.code());
            }
            let end = start.saturating_add(max).min(bytes.len());
            // Envoy writes nothing for an empty slice: the SDK then sees a null pointer.
            if end == start {
                return Ok(Status::Ok.code());
            }
            let slice = bytes[start..end].to_vec();
            Ok(hand_over(&mut c, &slice, ret_ptr, ret_size)?.code())
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_buffer_status",
        |mut c: Ctx<'_>, t: i32, len_ptr: i32, flags_ptr: i32| -> i32 {
            let len = match buffer(c.data(), t) {
                Ok(b) => b.len() as u32,
                Err(s) => return s.code(),
            };
            let written =
                write_u32(&mut c, len_ptr, len).and_then(|()| write_u32(&mut c, flags_ptr, 0));
            code(
                written
                    .map(|()| Status::Ok)
                    .ok_or(Status::InvalidMemoryAccess),
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: Ctx<'_>, t: i32, start: i32, len: i32, p: i32, l: i32| -> i32 {
            let data = match arg(&mut c, p, l) {
                Ok(d) => d,
                Err(s) => return s.code(),
            };
            let Some(stream) = c.data_mut().stream_mut() else {
                return Status::BadArgument.code();
            };
            let body = match BufferType::from_code(t) {
                Some(BufferType::RequestBody) => &mut stream.request_body,
                Some(BufferType::ResponseBody) => &mut stream.response_body,
                _ => return Status::BadArgument.code(),
            };
            let (start, len) = (word(start), word(len));
            // Envoy's Buffer::copyFrom: replace a prefix, or append; nothing in between.
            if start == 0 {
                body.drain(..len.min(body.len()));
                body.splice(0..0, data);
            } else if start >= body.len() {
                body.extend_from_slice(&data);
            } else {
                return Status::BadArgument.code();
            }
            Status::Ok.code()
        },
    )?;
    Ok(())
}
