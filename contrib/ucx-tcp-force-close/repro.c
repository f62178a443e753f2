/*
 * Minimal plain-UCP reproducer for a use-after-free in the UCX 1.22 TCP
 * transport (uct_tcp_iface_handle_events: rx_progress() may destroy the ep,
 * then tx_progress() is called on the freed ep).
 *
 * Two processes, A ("server") and B ("client"), talk over UCP/TCP.  Each
 * round (new workers and endpoints every time):
 *   1. A and B exchange worker addresses over pipes and create endpoints to
 *      each other (peer error handling); TCP merges them into one socket.
 *   2. B sends a small request AM; A answers with several large eager AMs.
 *   3. B stops progressing after the first reply (like a SIGSTOPped client),
 *      so A's socket send buffer fills and a partly sent fragment stays in
 *      A's TCP tx buffer.
 *   4. A closes its endpoint to B:  FORCE (default) or FLUSH (--flush-close).
 *      With FORCE the TCP ep keeps only RX and its CONN_FIN waits behind the
 *      pending tx data (EVWRITE stays armed).  A then stops progressing.
 *   5. B force-closes its endpoint (sends CONN_FIN to A) and drains the
 *      socket, which makes A's socket writable again.
 *   6. A progresses: one epoll event with EVREAD|EVWRITE; the CONN_FIN
 *      destroys the RX-only ep in rx_progress and tx_progress uses it.
 *
 * The use-after-free happens in every FORCE round (valgrind reports it);
 * whether A crashes depends on what the freed bytes contain, hence the
 * glibc malloc perturb settings in run.sh.
 *
 * Usage: repro [--flush-close] [rounds]
 * Exit status: 0 if A survived all rounds, 2 if A died, 1 on other errors.
 */
#define _GNU_SOURCE
#include <ucp/api/ucp.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AM_REQ    1
#define AM_REPLY  2
#define NREPLY    8
#define REPLY_LEN (512 * 1024)

static int flush_close;
static int nrounds = 30;
static int to_peer, from_peer; /* pipe fds of the current process */
static volatile int got_req, got_reply, ep_failed;

#define CHECK(_cond, _msg) \
    do { if (!(_cond)) { fprintf(stderr, "[%d] %s failed (%s:%d)\n", \
                                 getpid(), _msg, __FILE__, __LINE__); \
                         exit(1); } } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void xwrite(const void *buf, size_t len)
{
    CHECK(write(to_peer, buf, len) == (ssize_t)len, "pipe write");
}

static void xread(void *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = read(from_peer, (char*)buf + done, len - done);
        if (n <= 0) {
            /* peer is gone: nothing more to do */
            exit(3);
        }
        done += n;
    }
}

static void send_char(char c) { xwrite(&c, 1); }
static char recv_char(void) { char c; xread(&c, 1); return c; }

static int peer_msg_ready(void)
{
    struct pollfd p = { .fd = from_peer, .events = POLLIN };
    return poll(&p, 1, 0) > 0;
}

/* progress for 'sec' seconds without burning a whole core */
static void progress_for(ucp_worker_h w, double sec)
{
    double end = now() + sec;
    while (now() < end) {
        while (ucp_worker_progress(w)) {}
        usleep(200);
    }
}

static void wait_req(ucp_worker_h w, void *req, const char *what)
{
    double end = now() + 5;
    if (req == NULL) {
        return;
    }
    CHECK(!UCS_PTR_IS_ERR(req), what);
    while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        CHECK(now() < end, what);
        ucp_worker_progress(w);
    }
    ucp_request_free(req);
}

static ucs_status_t am_cb(void *arg, const void *hdr, size_t hdr_len,
                          void *data, size_t len,
                          const ucp_am_recv_param_t *param)
{
    (void)hdr; (void)hdr_len; (void)data; (void)len; (void)param;
    if ((long)arg == AM_REQ) {
        got_req = 1;
    } else {
        got_reply++;
    }
    return UCS_OK;
}

static void err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg; (void)ep; (void)status;
    ep_failed = 1;
}

static ucp_worker_h make_worker(ucp_context_h ctx)
{
    ucp_worker_params_t wp = {
        .field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                      UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .flags      = UCP_AM_FLAG_WHOLE_MSG,
        .cb         = am_cb,
    };
    ucp_worker_h w;

    CHECK(ucp_worker_create(ctx, &wp, &w) == UCS_OK, "ucp_worker_create");
    hp.id  = AM_REQ;
    hp.arg = (void*)(long)AM_REQ;
    CHECK(ucp_worker_set_am_recv_handler(w, &hp) == UCS_OK, "set_am_handler");
    hp.id  = AM_REPLY;
    hp.arg = (void*)(long)AM_REPLY;
    CHECK(ucp_worker_set_am_recv_handler(w, &hp) == UCS_OK, "set_am_handler");
    return w;
}

/* send my worker address to the peer, receive and connect to peer's */
static ucp_ep_h connect_peer(ucp_worker_h w, int send_first)
{
    ucp_address_t *addr, *peer;
    size_t len, plen;
    ucp_ep_h ep;
    ucp_ep_params_t ep_params = {
        .field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .err_mode        = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler     = { .cb = err_cb },
    };

    CHECK(ucp_worker_get_address(w, &addr, &len) == UCS_OK, "get_address");
    if (send_first) {
        xwrite(&len, sizeof(len));
        xwrite(addr, len);
    }
    xread(&plen, sizeof(plen));
    peer = malloc(plen);
    xread(peer, plen);
    if (!send_first) {
        xwrite(&len, sizeof(len));
        xwrite(addr, len);
    }
    ucp_worker_release_address(w, addr);

    ep_params.address = peer;
    CHECK(ucp_ep_create(w, &ep_params, &ep) == UCS_OK, "ucp_ep_create");
    free(peer);
    return ep;
}

static void *am_send(ucp_ep_h ep, unsigned id, void *buf, size_t len)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags        = UCP_AM_SEND_FLAG_EAGER,
    };
    return ucp_am_send_nbx(ep, id, NULL, 0, buf, len, &p);
}

static void *ep_close(ucp_ep_h ep, int force)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags        = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    return ucp_ep_close_nbx(ep, &p);
}

static void run_a(ucp_context_h ctx)
{
    static char buf[NREPLY][REPLY_LEN];
    void *sreq[NREPLY], *creq;
    int round, i, pending;

    for (round = 1; round <= nrounds; round++) {
        ucp_worker_h w = make_worker(ctx);
        ucp_ep_h ep    = connect_peer(w, 1);
        double end     = now() + 5;

        got_req = 0;
        while (!got_req) {                      /* B's request */
            CHECK(now() < end, "wait for request");
            ucp_worker_progress(w);
        }
        for (i = 0; i < NREPLY; i++) {          /* large replies */
            sreq[i] = am_send(ep, AM_REPLY, buf[i], REPLY_LEN);
            CHECK(!UCS_PTR_IS_ERR(sreq[i]), "ucp_am_send_nbx");
        }
        while (!peer_msg_ready()) {             /* until B stops */
            progress_for(w, 0.001);
        }
        CHECK(recv_char() == 'S', "sync S");
        progress_for(w, 0.05);                  /* fill the socket */

        for (i = 0, pending = 0; i < NREPLY; i++) {
            pending += (sreq[i] != NULL) &&
                       (ucp_request_check_status(sreq[i]) == UCS_INPROGRESS);
        }
        creq = ep_close(ep, !flush_close);
        CHECK(!UCS_PTR_IS_ERR(creq), "ucp_ep_close_nbx");
        progress_for(w, 0.01);                  /* let UCP destroy uct ep */
        send_char('G');                         /* B: close and drain */
        CHECK(recv_char() == 'C', "sync C");
        /* A resumes: CONN_FIN + writable socket arrive in one event */
        progress_for(w, 0.1);
        wait_req(w, creq, "close request");
        for (i = 0; i < NREPLY; i++) {
            wait_req(w, sreq[i], "send request");
        }
        send_char('D');
        CHECK(recv_char() == 'E', "sync E");
        ucp_worker_destroy(w);
        printf("round %d ok (%d sends pending at close)\n", round, pending);
        fflush(stdout);
    }
}

static void run_b(ucp_context_h ctx)
{
    static char req_buf[64];
    int round;

    for (round = 1; round <= nrounds; round++) {
        ucp_worker_h w = make_worker(ctx);
        ucp_ep_h ep    = connect_peer(w, 0);
        double end     = now() + 5;
        void *creq;

        got_reply = 0;
        wait_req(w, am_send(ep, AM_REQ, req_buf, sizeof(req_buf)), "request");
        while (!got_reply) {                    /* first reply arrived */
            CHECK(now() < end, "wait for reply");
            ucp_worker_progress(w);
        }
        send_char('S');                         /* stop progressing */
        CHECK(recv_char() == 'G', "sync G");
        creq = ep_close(ep, 1);                 /* CONN_FIN to A */
        CHECK(!UCS_PTR_IS_ERR(creq), "ucp_ep_close_nbx");
        progress_for(w, 0.05);                  /* drain A's data */
        send_char('C');
        while (!peer_msg_ready()) {             /* keep draining */
            progress_for(w, 0.005);
        }
        CHECK(recv_char() == 'D', "sync D");
        wait_req(w, creq, "close request");
        ucp_worker_destroy(w);
        send_char('E');
    }
}

int main(int argc, char **argv)
{
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features   = UCP_FEATURE_AM,
    };
    int a2b[2], b2a[2], status, i, ret = 0;
    ucp_context_h ctx;
    pid_t a, b;

    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--flush-close")) {
            flush_close = 1;
        } else {
            nrounds = atoi(argv[i]);
        }
    }
    CHECK(pipe(a2b) == 0 && pipe(b2a) == 0, "pipe");

    if ((a = fork()) == 0) {
        to_peer = a2b[1]; from_peer = b2a[0];
        close(a2b[0]); close(b2a[1]);
        CHECK(ucp_init(&params, NULL, &ctx) == UCS_OK, "ucp_init");
        run_a(ctx);
        ucp_cleanup(ctx);
        _exit(0);
    }
    if ((b = fork()) == 0) {
        to_peer = b2a[1]; from_peer = a2b[0];
        close(a2b[1]); close(b2a[0]);
        CHECK(ucp_init(&params, NULL, &ctx) == UCS_OK, "ucp_init");
        run_b(ctx);
        ucp_cleanup(ctx);
        _exit(0);
    }
    close(a2b[0]); close(a2b[1]); close(b2a[0]); close(b2a[1]);

    waitpid(a, &status, 0);
    if (WIFSIGNALED(status)) {
        printf("A (pid %d) killed by signal %d (%s)\n", a, WTERMSIG(status),
               strsignal(WTERMSIG(status)));
        ret = 2;
    } else if (WEXITSTATUS(status) != 0) {
        printf("A exited with status %d\n", WEXITSTATUS(status));
        ret = 1;
    } else {
        printf("A survived %d rounds (%s close)\n", nrounds,
               flush_close ? "flush" : "force");
    }
    if (ret != 0) {
        kill(b, SIGKILL);
    }
    waitpid(b, &status, 0);
    return ret;
}
