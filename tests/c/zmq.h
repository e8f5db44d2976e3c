/* The few declarations of libzmq's stable C API (zmq.h of libzmq 4.x) that docs/examples/stream_client.c and
   the C snippets of docs/reference/stream.md use, for building them against the libzmq that pyzmq's wheel bundles where no system zmq.h is installed.
   The values are libzmq's own; a system <zmq.h> is used instead whenever one exists. */
#ifndef ARMID_TEST_MINIMAL_ZMQ_H
#define ARMID_TEST_MINIMAL_ZMQ_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZMQ_SUB 2
#define ZMQ_REQ 3
#define ZMQ_SUBSCRIBE 6
#define ZMQ_RCVMORE 13
#define ZMQ_LINGER 17
#define ZMQ_RCVTIMEO 27
#define ZMQ_CURVE_PUBLICKEY 48
#define ZMQ_CURVE_SECRETKEY 49
#define ZMQ_CURVE_SERVERKEY 50

void *zmq_ctx_new(void);
int zmq_ctx_term(void *context);
void *zmq_socket(void *context, int type);
int zmq_close(void *s);
int zmq_setsockopt(void *s, int option, const void *optval, size_t optvallen);
int zmq_getsockopt(void *s, int option, void *optval, size_t *optvallen);
int zmq_connect(void *s, const char *addr);
int zmq_recv(void *s, void *buf, size_t len, int flags);
int zmq_send(void *s, const void *buf, size_t len, int flags);
int zmq_curve_keypair(char *z85_public_key, char *z85_secret_key);
int zmq_errno(void);
const char *zmq_strerror(int errnum);

#ifdef __cplusplus
}
#endif

#endif
