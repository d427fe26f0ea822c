//! The callbacks Envoy 1.40 exports to modules, declared as `abi.h` declares them.

use super::{
    ConfigEnvoyPtr, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr, FilterSchedulerPtr, ModuleBuffer,
    ModuleHeader, SchedulerPtr,
};

extern "C" {
    pub(super) fn envoy_dynamic_module_callback_log(level: i32, message: ModuleBuffer);
    pub(super) fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: ConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_length: usize,
        counter_id: *mut usize,
    ) -> i32;
    pub(super) fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: ConfigEnvoyPtr,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> i32;
    pub(super) fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: FilterEnvoyPtr,
        header_type: i32,
    ) -> usize;
    pub(super) fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoyPtr,
        header_type: i32,
        result: *mut EnvoyHeader,
    ) -> bool;
    pub(super) fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterEnvoyPtr,
        header_type: i32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    pub(super) fn envoy_dynamic_module_callback_http_add_header(
        filter: FilterEnvoyPtr,
        header_type: i32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub(super) fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: i32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub(super) fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    pub(super) fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: FilterEnvoyPtr,
        body_type: i32,
    ) -> usize;
    pub(super) fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoyPtr,
        body_type: i32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub(super) fn envoy_dynamic_module_callback_http_get_body_size(
        filter: FilterEnvoyPtr,
        body_type: i32,
    ) -> usize;
    pub(super) fn envoy_dynamic_module_callback_http_append_body(
        filter: FilterEnvoyPtr,
        body_type: i32,
        data: ModuleBuffer,
    ) -> bool;
    pub(super) fn envoy_dynamic_module_callback_http_drain_body(
        filter: FilterEnvoyPtr,
        body_type: i32,
        number_of_bytes: usize,
    ) -> bool;
    pub(super) fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterEnvoyPtr,
        attribute_id: i32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub(super) fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter: FilterEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> i32;
    pub(super) fn envoy_dynamic_module_callback_http_filter_continue_decoding(
        filter: FilterEnvoyPtr,
    );
    pub(super) fn envoy_dynamic_module_callback_http_filter_scheduler_new(
        filter: FilterEnvoyPtr,
    ) -> FilterSchedulerPtr;
    pub(super) fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
        scheduler: FilterSchedulerPtr,
        event_id: u64,
    );
    pub(super) fn envoy_dynamic_module_callback_http_filter_scheduler_delete(
        scheduler: FilterSchedulerPtr,
    );
    pub(super) fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        config: ConfigEnvoyPtr,
    ) -> SchedulerPtr;
    pub(super) fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: SchedulerPtr,
        event_id: u64,
    );
    pub(super) fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
        scheduler: SchedulerPtr,
    );
    pub(super) fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: ConfigEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> i32;
    pub(super) fn envoy_dynamic_module_callback_http_filter_config_start_http_stream(
        config: ConfigEnvoyPtr,
        stream_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        end_stream: bool,
        timeout_milliseconds: u64,
    ) -> i32;
    pub(super) fn envoy_dynamic_module_callback_http_filter_config_stream_send_data(
        config: ConfigEnvoyPtr,
        stream_id: u64,
        data: ModuleBuffer,
        end_stream: bool,
    ) -> bool;
    pub(super) fn envoy_dynamic_module_callback_http_filter_config_reset_http_stream(
        config: ConfigEnvoyPtr,
        stream_id: u64,
    );
}
