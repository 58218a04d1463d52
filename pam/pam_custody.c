/*
 * pam_custody: unlock a user's Custody identities at login with the login password.
 *
 *   auth     optional pam_custody.so   keeps the password pam_unix checked, for the session step;
 *                                      setcred with PAM_REINITIALIZE_CRED or PAM_REFRESH_CRED (a
 *                                      screen locker's unlock) unlocks with it at once
 *   session  optional pam_custody.so   open: unlocks the user's identities (their login protectors);
 *                                      close: with the lock_on_close option, locks them when it
 *                                      was the user's last session (open counts it, by this
 *                                      process and its logind session ID)
 *   password optional pam_custody.so   chauthtok: rewraps the login protectors under the new password
 *
 * Options: socket=PATH (default /run/custody/control.sock), add_protector (an unlocked identity
 * without a login protector gets one at login), lock_on_close, debug.
 *
 * The module never blocks a login or a password change: every failure (daemon down, socket
 * missing, wrong password) returns PAM_IGNORE or PAM_SUCCESS and leaves one line in syslog
 * (LOG_AUTHPRIV). No password is ever logged; every copy is zeroed when dropped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <security/pam_ext.h>
#include <security/pam_modules.h>

#define DEFAULT_SOCKET "/run/custody/control.sock"
#define STASH "pam_custody_authtok"
#define TIMEOUT_MS 5000

struct options {
    const char *socket;
    int add_protector;
    int lock_on_close;
    int debug;
};

static void parse_options(int argc, const char **argv, struct options *options) {
    options->socket = DEFAULT_SOCKET;
    options->add_protector = options->lock_on_close = options->debug = 0;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "socket=", 7) == 0) options->socket = argv[i] + 7;
        else if (strcmp(argv[i], "add_protector") == 0) options->add_protector = 1;
        else if (strcmp(argv[i], "lock_on_close") == 0) options->lock_on_close = 1;
        else if (strcmp(argv[i], "debug") == 0) options->debug = 1;
    }
}

/* A growable buffer whose contents are zeroed before they are freed (they hold passwords). */
struct buffer {
    char *data;
    size_t length, capacity;
    int failed;
};

static void buffer_append(struct buffer *b, const char *text, size_t length) {
    if (b->failed) return;
    if (b->length + length + 1 > b->capacity) {
        size_t capacity = (b->capacity ? b->capacity : 256);
        while (capacity < b->length + length + 1) capacity *= 2;
        char *grown = malloc(capacity);
        if (!grown) { b->failed = 1; return; }
        if (b->data) {
            memcpy(grown, b->data, b->length);
            explicit_bzero(b->data, b->capacity);
            free(b->data);
        }
        b->data = grown;
        b->capacity = capacity;
    }
    memcpy(b->data + b->length, text, length);
    b->length += length;
    b->data[b->length] = 0;
}

static void buffer_text(struct buffer *b, const char *text) { buffer_append(b, text, strlen(text)); }

/* A JSON string: quotes, backslashes and control characters escaped; other bytes as they are. */
static void buffer_json_string(struct buffer *b, const char *text) {
    buffer_append(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        char escaped[8];
        if (*p == '"' || *p == '\\') { escaped[0] = '\\'; escaped[1] = (char)*p; buffer_append(b, escaped, 2); }
        else if (*p < 0x20) { snprintf(escaped, sizeof escaped, "\\u%04x", *p); buffer_append(b, escaped, 6); }
        else buffer_append(b, (const char *)p, 1);
    }
    buffer_append(b, "\"", 1);
}

static void buffer_free(struct buffer *b) {
    if (b->data) { explicit_bzero(b->data, b->capacity); free(b->data); }
    b->data = NULL;
    b->length = b->capacity = 0;
}

static long long milliseconds_now(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* POSTs `body` (JSON) to `path` on the control socket; the HTTP status, or -1 (errno set). The
   status says what happened (the routes answer partial success with 207): no body is read. */
static int post(const char *socket_path, const char *path, const struct buffer *body) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    struct sockaddr_un address = { .sun_family = AF_UNIX };
    if (strlen(socket_path) >= sizeof address.sun_path) { close(fd); errno = ENAMETOOLONG; return -1; }
    strcpy(address.sun_path, socket_path);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0 && errno != EINPROGRESS && errno != EAGAIN) {
        int saved = errno; close(fd); errno = saved; return -1;
    }
    struct buffer request = { 0 };
    char head[256];
    snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: custody\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
             path, body->length);
    buffer_text(&request, head);
    buffer_append(&request, body->data ? body->data : "", body->length);
    if (request.failed) { buffer_free(&request); close(fd); errno = ENOMEM; return -1; }

    long long deadline = milliseconds_now() + TIMEOUT_MS;
    size_t sent = 0;
    char reply[4096];
    size_t received = 0;
    int status = -1;
    while (1) {
        long long left = deadline - milliseconds_now();
        if (left <= 0) { errno = ETIMEDOUT; break; }
        struct pollfd wait = { .fd = fd, .events = sent < request.length ? POLLOUT : POLLIN };
        int ready = poll(&wait, 1, (int)left);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) { if (ready == 0) errno = ETIMEDOUT; break; }
        if (sent < request.length) {
            ssize_t n = send(fd, request.data + sent, request.length - sent, MSG_NOSIGNAL);
            if (n < 0) { if (errno == EAGAIN || errno == EINTR) continue; break; }
            sent += (size_t)n;
            continue;
        }
        ssize_t n = recv(fd, reply + received, sizeof reply - 1 - received, 0);
        if (n < 0) { if (errno == EAGAIN || errno == EINTR) continue; break; }
        received += (size_t)n;
        if (n == 0 || received == sizeof reply - 1) {
            reply[received] = 0;
            int code = 0;
            if (sscanf(reply, "HTTP/1.%*c %d", &code) == 1) status = code; else errno = EPROTO;
            break;
        }
    }
    buffer_free(&request);
    close(fd);
    return status;
}

static void drop_stash(pam_handle_t *pamh, void *data, int error_status) {
    (void)pamh;
    (void)error_status;
    if (data) { explicit_bzero(data, strlen(data)); free(data); }
}

PAM_EXTERN int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options options;
    parse_options(argc, argv, &options);
    const void *token = NULL;
    if (pam_get_item(pamh, PAM_AUTHTOK, &token) != PAM_SUCCESS || token == NULL) {
        if (options.debug) pam_syslog(pamh, LOG_DEBUG, "no password to keep (put pam_custody after the module that asks for it)");
        return PAM_IGNORE;
    }
    char *copy = strdup(token);
    if (!copy) return PAM_IGNORE;
    if (pam_set_data(pamh, STASH, copy, drop_stash) != PAM_SUCCESS) drop_stash(pamh, copy, 0);
    return PAM_IGNORE;
}

/* Unlocks the user's identities with the password the auth step kept, then drops it. */
static void unlock_with_stash(pam_handle_t *pamh, const struct options *options) {
    const char *user = NULL;
    const void *stash = NULL;
    if (pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || !user) return;
    if (pam_get_data(pamh, STASH, &stash) != PAM_SUCCESS || !stash) {
        if (options->debug) pam_syslog(pamh, LOG_DEBUG, "no password from the auth step for %s", user);
        return;
    }
    struct buffer body = { 0 };
    buffer_text(&body, "{\"user\": ");
    buffer_json_string(&body, user);
    buffer_text(&body, ", \"password\": ");
    buffer_json_string(&body, stash);
    buffer_text(&body, options->add_protector ? ", \"addProtectors\": true}" : "}");
    /* The password is not needed any more: the stash is zeroed and dropped now. */
    pam_set_data(pamh, STASH, NULL, NULL);
    int status = body.failed ? -1 : post(options->socket, "/v1/login/unlock", &body);
    int saved = errno;
    buffer_free(&body);
    /* 200: every identity of the user unlocked; 207: some stay locked. */
    if (status == 200) {
        if (options->debug) pam_syslog(pamh, LOG_DEBUG, "custody: identities of %s unlocked", user);
    } else if (status == 207) {
        pam_syslog(pamh, LOG_NOTICE, "custody: some identities of %s stay locked (the login password did not unlock them)", user);
    } else if (status < 0) {
        pam_syslog(pamh, LOG_NOTICE, "custody: cannot reach custodyd at %s (%s); identities of %s stay locked", options->socket, strerror(saved), user);
    } else {
        pam_syslog(pamh, LOG_NOTICE, "custody: custodyd refused to unlock identities of %s (HTTP %d)", user, status);
    }
}

PAM_EXTERN int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    /* A screen locker authenticates, then refreshes the credentials: that is its unlock. A
       login's PAM_ESTABLISH_CRED waits for the session step. */
    if (flags & (PAM_REINITIALIZE_CRED | PAM_REFRESH_CRED)) {
        struct options options;
        parse_options(argc, argv, &options);
        unlock_with_stash(pamh, &options);
    }
    return PAM_IGNORE;
}

/* The body naming this login session: the user, this process (PAM closes the session from the
   process that opened it) and, where pam_systemd gave it one, its logind session ID. */
static void session_body(pam_handle_t *pamh, struct buffer *body, const char *user) {
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    buffer_text(body, "{\"user\": ");
    buffer_json_string(body, user);
    buffer_text(body, ", \"session\": ");
    buffer_text(body, pid);
    const char *login_session = pam_getenv(pamh, "XDG_SESSION_ID");
    if (login_session && *login_session) {
        buffer_text(body, ", \"loginSession\": ");
        buffer_json_string(body, login_session);
    }
    buffer_text(body, "}");
}

PAM_EXTERN int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options options;
    parse_options(argc, argv, &options);
    unlock_with_stash(pamh, &options);
    /* Counted, so that closing one of the user's sessions locks only when it was the last. */
    const char *user = NULL;
    if (!options.lock_on_close || pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || !user) return PAM_SUCCESS;
    struct buffer body = { 0 };
    session_body(pamh, &body, user);
    int status = body.failed ? -1 : post(options.socket, "/v1/login/open", &body);
    int saved = errno;
    buffer_free(&body);
    if (status != 204) pam_syslog(pamh, LOG_NOTICE, "custody: session of %s not counted (%s); its close locks the identities", user, status < 0 ? strerror(saved) : "refused");
    return PAM_SUCCESS;
}

PAM_EXTERN int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options options;
    parse_options(argc, argv, &options);
    const char *user = NULL;
    if (!options.lock_on_close || pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || !user) return PAM_SUCCESS;
    struct buffer body = { 0 };
    session_body(pamh, &body, user);
    /* The identities lock when this was the user's last session. */
    int status = body.failed ? -1 : post(options.socket, "/v1/login/lock", &body);
    int saved = errno;
    buffer_free(&body);
    if (status != 200) pam_syslog(pamh, LOG_NOTICE, "custody: cannot lock identities of %s at logout (%s)", user, status < 0 ? strerror(saved) : "refused");
    return PAM_SUCCESS;
}

PAM_EXTERN int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    struct options options;
    parse_options(argc, argv, &options);
    if (!(flags & PAM_UPDATE_AUTHTOK)) return PAM_IGNORE;
    const char *user = NULL;
    const void *old = NULL, *new = NULL;
    if (pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || !user) return PAM_IGNORE;
    if (pam_get_item(pamh, PAM_AUTHTOK, &new) != PAM_SUCCESS || !new) return PAM_IGNORE;
    pam_get_item(pamh, PAM_OLDAUTHTOK, &old);
    struct buffer body = { 0 };
    buffer_text(&body, "{\"user\": ");
    buffer_json_string(&body, user);
    if (old) { buffer_text(&body, ", \"old\": "); buffer_json_string(&body, old); }
    buffer_text(&body, ", \"new\": ");
    buffer_json_string(&body, new);
    buffer_text(&body, "}");
    int status = body.failed ? -1 : post(options.socket, "/v1/login/password", &body);
    int saved = errno;
    buffer_free(&body);
    /* 200: every login protector follows the new password; 207: some could not. */
    if (status == 207) {
        pam_syslog(pamh, LOG_NOTICE, "custody: some login protectors of %s could not be rewrapped; unlock them with their passphrase", user);
    } else if (status != 200) {
        pam_syslog(pamh, LOG_NOTICE, "custody: login protectors of %s not rewrapped (%s)", user, status < 0 ? strerror(saved) : "refused");
    }
    return PAM_IGNORE;
}
