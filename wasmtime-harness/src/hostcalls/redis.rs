//! The Higress redis-call host functions, `proxy_redis_init` and `proxy_redis_call` (stock
//! Envoy has neither; see `crate::redis` for why the harness serves them). They record what
//! the guest declares and asks for in `HostState::redis`, where a test answers it.

use crate::abi::Status;
use crate::memory::{arg, write_u32, Ctx};
use crate::redis::{RedisCall, RedisCluster};
use crate::state::HostState;
use wasmtime::Linker;

pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_redis_init",
        |mut c: Ctx<'_>,
         cp: i32,
         cl: i32,
         up: i32,
         ul: i32,
         pp: i32,
         pl: i32,
         timeout: i32|
         -> i32 {
            let (Ok(name), Ok(username), Ok(password)) = (
                arg(&mut c, cp, cl),
                arg(&mut c, up, ul),
                arg(&mut c, pp, pl),
            ) else {
                return Status::InvalidMemoryAccess.code();
            };
            let name = String::from_utf8_lossy(&name).into_owned();
            let clusters = &mut c.data_mut().redis.clusters;
            clusters.retain(|k| k.name != name);
            clusters.push(RedisCluster {
                name,
                username,
                password,
                timeout_ms: timeout as u32,
            });
            Status::Ok.code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_redis_call",
        |mut c: Ctx<'_>, cp: i32, cl: i32, qp: i32, ql: i32, ret_token: i32| -> i32 {
            let (Ok(cluster), Ok(query)) = (arg(&mut c, cp, cl), arg(&mut c, qp, ql)) else {
                return Status::InvalidMemoryAccess.code();
            };
            let cluster = String::from_utf8_lossy(&cluster).into_owned();
            let state = c.data_mut();
            if !state.redis.clusters.iter().any(|k| k.name == cluster) {
                return Status::BadArgument.code();
            }
            let token = state.next_token;
            if write_u32(&mut c, ret_token, token).is_none() {
                return Status::InvalidMemoryAccess.code();
            }
            let state = c.data_mut();
            state.next_token += 1;
            state.redis.calls.push(RedisCall {
                token,
                cluster,
                query,
                answered: false,
            });
            Status::Ok.code()
        },
    )?;
    Ok(())
}
