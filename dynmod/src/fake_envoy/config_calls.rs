//! The fake's configuration callbacks: the log, counters, the configuration's scheduler,
//! and the main thread's callouts and streams.

use super::{bytes, envoy, pairs, text, Envoy, Stream};
use crate::abi::{
    ConfigEnvoyPtr, ModuleBuffer, ModuleHeader, SchedulerPtr, CALLOUT_OK, METRICS_OK,
};

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_log(_level: i32, message: ModuleBuffer) {
    eprintln!("{}", text(&message));
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_counter(
    config: ConfigEnvoyPtr,
    name: ModuleBuffer,
    _labels: *const ModuleBuffer,
    _labels_length: usize,
    counter_id: *mut usize,
) -> i32 {
    let mut envoy = envoy();
    let Some(config) = envoy.configs.get_mut(&(config as usize)) else {
        return 1;
    };
    config.counters.push((text(&name), 0));
    // SAFETY: the module's out pointer.
    unsafe { *counter_id = config.counters.len() - 1 };
    METRICS_OK
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
    config: ConfigEnvoyPtr,
    id: usize,
    _labels: *const ModuleBuffer,
    _labels_length: usize,
    value: u64,
) -> i32 {
    let mut envoy = envoy();
    let counter = (envoy.configs.get_mut(&(config as usize))).and_then(|c| c.counters.get_mut(id));
    match counter {
        Some((_, n)) => {
            *n += value;
            METRICS_OK
        }
        None => 1,
    }
}

/// A configuration's scheduler is its configuration pointer.
#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
    config: ConfigEnvoyPtr,
) -> SchedulerPtr {
    config
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
    scheduler: SchedulerPtr,
    event_id: u64,
) {
    let mut envoy = envoy();
    if let Some(config) = envoy.configs.get_mut(&(scheduler as usize)) {
        config.events.push(event_id);
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
    scheduler: SchedulerPtr,
) {
    let _ = scheduler;
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_http_callout(
    config: ConfigEnvoyPtr,
    callout_id_out: *mut u64,
    _cluster: ModuleBuffer,
    _headers: *const ModuleHeader,
    _headers_size: usize,
    body: ModuleBuffer,
    _timeout_ms: u64,
) -> i32 {
    let mut envoy = envoy();
    let Some(config) = envoy.configs.get_mut(&(config as usize)) else {
        return 1;
    };
    config.callouts.push(bytes(&body));
    // SAFETY: the module's out pointer.
    unsafe { *callout_id_out = config.callouts.len() as u64 };
    CALLOUT_OK
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_start_http_stream(
    config: ConfigEnvoyPtr,
    stream_id_out: *mut u64,
    _cluster: ModuleBuffer,
    headers: *const ModuleHeader,
    headers_size: usize,
    _body: ModuleBuffer,
    _end_stream: bool,
    _timeout_ms: u64,
) -> i32 {
    let headers = pairs(headers, headers_size);
    let mut envoy = envoy();
    let id = envoy.next_id();
    let Some(config) = envoy.configs.get_mut(&(config as usize)) else {
        return 1;
    };
    if config.refuse_streams {
        return 1;
    }
    config.streams.insert(id, Stream::new(headers));
    // SAFETY: the module's out pointer.
    unsafe { *stream_id_out = id };
    CALLOUT_OK
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_stream_send_data(
    config: ConfigEnvoyPtr,
    stream_id: u64,
    data: ModuleBuffer,
    _end_stream: bool,
) -> bool {
    let data = bytes(&data);
    let mut envoy = envoy();
    let stream = stream_of(&mut envoy, config, stream_id);
    match stream {
        Some(stream) if !stream.reset => {
            stream.sent.push(&data);
            true
        }
        _ => false,
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_reset_http_stream(
    config: ConfigEnvoyPtr,
    stream_id: u64,
) {
    let mut envoy = envoy();
    if let Some(stream) = stream_of(&mut envoy, config, stream_id) {
        stream.reset = true;
    }
}

fn stream_of(envoy: &mut Envoy, config: ConfigEnvoyPtr, id: u64) -> Option<&mut Stream> {
    envoy
        .configs
        .get_mut(&(config as usize))?
        .streams
        .get_mut(&id)
}
