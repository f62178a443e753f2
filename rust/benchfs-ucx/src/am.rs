//! Active messages: the handlers a worker runs for each message id, eager and rendezvous
//! payloads, and receiving or releasing a rendezvous payload.

use std::ffi::c_void;
use std::rc::Rc;

use benchfs_ucx_sys as sys;

use crate::*;

/// Where an active message's payload is.
pub enum AmData<'a> {
    /// Eager payload, valid only during the handler call.
    Eager(&'a [u8]),
    /// Rendezvous payload still at the sender: receive it with [`Worker::recv_data`].
    Rendezvous(RndvDesc),
}

/// A rendezvous data descriptor. If the handler returns [`AmVerdict::Keep`], exactly one of
/// [`Worker::recv_data`] or [`Worker::release_data`] must later be called with it.
#[derive(Debug, Clone, Copy)]
pub struct RndvDesc {
    pub(crate) desc: *mut c_void,
    pub len: usize,
}

/// One received active message.
pub struct AmMessage<'a> {
    pub header: &'a [u8],
    pub data: AmData<'a>,
}

/// What the handler did with a rendezvous descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmVerdict {
    /// Done with the message (a rendezvous descriptor not received is dropped by UCX).
    Done,
    /// The handler kept the rendezvous descriptor for later.
    Keep,
}

pub(crate) type AmHandlerBox = Box<dyn FnMut(AmMessage<'_>) -> AmVerdict>;

pub(crate) unsafe extern "C" fn am_trampoline(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the AmHandlerBox registered in set_am_handler, alive until worker drop;
    // UCX passes valid header/data pointers for the duration of the call.
    let handler = &mut *(arg as *mut AmHandlerBox);
    let param = &*param;
    let header = if header_length == 0 || header.is_null() {
        &[][..]
    } else {
        std::slice::from_raw_parts(header as *const u8, header_length)
    };
    let rndv = param.recv_attr & (sys::UCP_AM_RECV_ATTR_FLAG_RNDV as u64) != 0;
    let payload = if rndv {
        AmData::Rendezvous(RndvDesc {
            desc: data,
            len: length,
        })
    } else if length == 0 || data.is_null() {
        AmData::Eager(&[])
    } else {
        AmData::Eager(std::slice::from_raw_parts(data as *const u8, length))
    };
    let verdict = handler(AmMessage {
        header,
        data: payload,
    });
    match verdict {
        AmVerdict::Keep if rndv => sys::UCS_INPROGRESS,
        _ => sys::UCS_OK,
    }
}

impl Worker {
    /// Registers the handler for active-message id `id`, replacing any earlier one.
    pub fn set_am_handler<F>(&self, id: u16, handler: F) -> Result<()>
    where
        F: FnMut(AmMessage<'_>) -> AmVerdict + 'static,
    {
        let boxed: *mut AmHandlerBox = Box::into_raw(Box::new(Box::new(handler)));
        let param = sys::ucp_am_handler_param_t {
            field_mask: (sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG
                | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS) as u64,
            id: id as u32,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(am_trampoline),
            arg: boxed as *mut c_void,
        };
        // SAFETY: the box stays alive (in `handlers`) until the worker is destroyed.
        let status = unsafe { sys::ucp_worker_set_am_recv_handler(self.inner.worker, &param) };
        self.inner.handlers.borrow_mut().push(boxed);
        check("set_am_recv_handler", status)
    }

    /// Sends an active message on an endpoint handle.
    ///
    /// The header is copied into the request; the data is not.
    ///
    /// # Safety
    /// `ep` is a live endpoint of this worker; `data` must stay valid and unmodified until the
    /// returned request completes.
    pub(crate) unsafe fn send_am(
        &self,
        ep: sys::ucp_ep_h,
        id: u16,
        header: &[u8],
        data: &[u8],
        memh: Option<&MemHandle>,
    ) -> Request {
        let state = RequestState::new(header.to_vec().into_boxed_slice(), Some(self.inner.held.clone()));
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA,
            user_data: Rc::into_raw(state.clone()) as *mut c_void,
            ..Default::default()
        };
        param.cb.send = Some(send_done);
        if let Some(m) = memh {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
            param.memh = m.memh;
        }
        let status_ptr = sys::ucp_am_send_nbx(
            ep,
            id as u32,
            state.header.as_ptr() as *const c_void,
            state.header.len(),
            data.as_ptr() as *const c_void,
            data.len(),
            &param,
        );
        Self::finish_start(state, status_ptr, param.user_data, "am_send", data.len())
    }

    /// Starts receiving a rendezvous payload into `buf`.
    ///
    /// # Safety
    /// `desc` comes from a handler that returned [`AmVerdict::Keep`] (or is being used inside
    /// the handler) and is used once; `buf` stays valid until the request completes.
    pub unsafe fn recv_data(&self, desc: RndvDesc, buf: &mut [u8], memh: Option<&MemHandle>) -> Request {
        let state = RequestState::new(Box::new([]), Some(self.inner.held.clone()));
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
                | sys::UCP_OP_ATTR_FIELD_USER_DATA
                | sys::UCP_OP_ATTR_FIELD_DATATYPE,
            datatype: sys::ucp_dt_make_contig(1),
            user_data: Rc::into_raw(state.clone()) as *mut c_void,
            ..Default::default()
        };
        param.cb.recv_am = Some(recv_done);
        if let Some(m) = memh {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
            param.memh = m.memh;
        }
        let len = desc.len.min(buf.len());
        let status_ptr = sys::ucp_am_recv_data_nbx(
            self.inner.worker,
            desc.desc,
            buf.as_mut_ptr() as *mut c_void,
            len,
            &param,
        );
        Self::finish_start(state, status_ptr, param.user_data, "am_recv_data", len)
    }

    /// Drops a kept rendezvous descriptor without receiving it.
    ///
    /// # Safety
    /// `desc` was kept by a handler and has not been used.
    pub unsafe fn release_data(&self, desc: RndvDesc) {
        sys::ucp_am_data_release(self.inner.worker, desc.desc);
    }
}
