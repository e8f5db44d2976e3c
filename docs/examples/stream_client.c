/* Print the armid driver's state stream from C (layout: docs/reference/stream.md, macros: armid_wire.h).
 *
 *   sudo apt-get install libzmq3-dev        (zmq.h and libzmq.so; pyzmq's wheel has no header)
 *   cc -std=c99 -I firmware_bridge docs/examples/stream_client.c -lzmq -o stream_client   (from armid's folder)
 *   ./stream_client [ENDPOINT] [COUNT]          (default tcp://127.0.0.1:5555, 10 samples)
 *
 * One line per sample: seq, driver flags, lost device samples, device and host time (ns), then q, qd and
 * torque of every joint (rad, rad/s, N m; %.17g prints each double exactly); flags & ARMID_STREAM_FLAG_ENABLED
 * says the drives are enabled, ARMID_STREAM_FLAG_FAULT a fault, and so on. Exits 0 after COUNT samples,
 * 1 if no message comes within 5 s or a message is not a state message this header reads. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "armid_wire.h"

#define TIMEOUT_MS 5000
#define MAX_PAYLOAD 65536 /* n is a uint16: far more than any arm's message */

/* The k-th double of the array at `offset`. The doubles start at offset 36, which is not 8-byte aligned:
   copy the bytes out instead of casting the buffer to double * (undefined behaviour, a bus error on some CPUs). */
static double get_double(const uint8_t *payload, size_t offset, int k)
{
    double v;
    memcpy(&v, payload + offset + (size_t)k * sizeof v, sizeof v);
    return v;
}

static void print_doubles(const uint8_t *payload, size_t offset, int n)
{
    for (int k = 0; k < n; k++) printf(" %.17g", get_double(payload, offset, k));
}

int main(int argc, char **argv)
{
    const char *endpoint = argc > 1 ? argv[1] : "tcp://127.0.0.1:5555";
    long count = argc > 2 ? strtol(argv[2], NULL, 10) : 10;
    static uint8_t payload[MAX_PAYLOAD];
    char topic[32];
    int timeout = TIMEOUT_MS, linger = 0, status = 0;

    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout, sizeof timeout); /* bounded wait for every frame */
    zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, ARMID_STREAM_TOPIC_STATE, strlen(ARMID_STREAM_TOPIC_STATE));
    if (zmq_connect(sub, endpoint) != 0) {
        fprintf(stderr, "%s: %s\n", endpoint, zmq_strerror(zmq_errno()));
        status = 1;
    }
    for (long i = 0; status == 0 && i < count; i++) {
        /* a state message is two frames: the topic, then the payload */
        int more = 0;
        size_t more_size = sizeof more;
        int t = zmq_recv(sub, topic, sizeof topic, 0);
        if (t >= 0) zmq_getsockopt(sub, ZMQ_RCVMORE, &more, &more_size);
        int len = (t >= 0 && more) ? zmq_recv(sub, payload, sizeof payload, 0) : -1;
        if (len < 0) {
            int err = zmq_errno();
            fprintf(stderr, "%s: %s\n", endpoint, err == EAGAIN ? "no state message within 5 s" : zmq_strerror(err));
            status = 1;
            break;
        }
        armid_stream_header_t h; /* a packed copy of the 36-byte header */
        int n = len <= MAX_PAYLOAD ? armid_stream_check(payload, (size_t)len, &h) : -1;
        if (n < 0) {
            fprintf(stderr, "not a state message of version %d-%d (%d bytes)\n",
                    ARMID_STREAM_OLDEST_READABLE_VERSION, ARMID_STREAM_VERSION, len);
            status = 1;
            break;
        }
        printf("%" PRIu64 " %" PRIu32 " %" PRIu32 " %" PRId64 " %" PRId64, h.seq,
               h.flags & ARMID_STREAM_DRIVER_FLAGS_MASK, ARMID_STREAM_LOST_SAMPLES(h.flags), h.device_time_ns,
               h.host_time_ns);
        print_doubles(payload, ARMID_STREAM_Q_OFFSET(n), n);      /* rad */
        print_doubles(payload, ARMID_STREAM_QD_OFFSET(n), n);     /* rad/s */
        print_doubles(payload, ARMID_STREAM_TORQUE_OFFSET(n), n); /* N m */
        printf("\n");
        fflush(stdout);
    }
    zmq_close(sub);
    zmq_ctx_term(ctx);
    return status;
}
