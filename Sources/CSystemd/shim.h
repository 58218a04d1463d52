/* sd-bus (libsystemd), and the few calls whose C signatures Swift cannot call (varargs). */
#ifndef CUSTODY_CSYSTEMD_H
#define CUSTODY_CSYSTEMD_H
#include <systemd/sd-bus.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUSTODY_LOGIN1 "org.freedesktop.login1"
#define CUSTODY_LOGIN1_PATH "/org/freedesktop/login1"
#define CUSTODY_LOGIN1_MANAGER "org.freedesktop.login1.Manager"

/* Manager.Inhibit(what, who, why, mode): a duplicate of the inhibitor descriptor (the caller
   closes it to release), or -errno. */
static inline int custody_login1_inhibit(sd_bus *bus, const char *what, const char *who, const char *why, const char *mode) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    int result = sd_bus_call_method(bus, CUSTODY_LOGIN1, CUSTODY_LOGIN1_PATH, CUSTODY_LOGIN1_MANAGER, "Inhibit",
                                    &error, &reply, "ssss", what, who, why, mode);
    sd_bus_error_free(&error);
    if (result < 0) return result;
    int fd = -1;
    result = sd_bus_message_read(reply, "h", &fd);
    int copy = result < 0 ? result : fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (result >= 0 && copy < 0) copy = -errno;
    sd_bus_message_unref(reply);
    return copy;
}

/* One session of Manager.ListSessions: id, uid, user name, seat, object path. */
typedef struct {
    char id[64];
    uint32_t uid;
    char path[256];
} custody_login1_session;

/* Manager.ListSessions into `sessions` (at most `capacity`): the number listed, or -errno. */
static inline int custody_login1_list_sessions(sd_bus *bus, custody_login1_session *sessions, int capacity) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    int result = sd_bus_call_method(bus, CUSTODY_LOGIN1, CUSTODY_LOGIN1_PATH, CUSTODY_LOGIN1_MANAGER, "ListSessions",
                                    &error, &reply, "");
    sd_bus_error_free(&error);
    if (result < 0) return result;
    int count = 0;
    result = sd_bus_message_enter_container(reply, 'a', "(susso)");
    while (result >= 0) {
        const char *id = NULL, *user = NULL, *seat = NULL, *path = NULL;
        uint32_t uid = 0;
        result = sd_bus_message_read(reply, "(susso)", &id, &uid, &user, &seat, &path);
        if (result <= 0) break;
        if (count < capacity) {
            strncpy(sessions[count].id, id, sizeof(sessions[count].id) - 1);
            sessions[count].id[sizeof(sessions[count].id) - 1] = 0;
            strncpy(sessions[count].path, path, sizeof(sessions[count].path) - 1);
            sessions[count].path[sizeof(sessions[count].path) - 1] = 0;
            sessions[count].uid = uid;
            count++;
        }
    }
    sd_bus_message_unref(reply);
    return result < 0 ? result : count;
}

/* The boolean property `name` of a session object: 0 or 1, or -errno. */
static inline int custody_login1_session_flag(sd_bus *bus, const char *path, const char *name) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    int value = 0;
    int result = sd_bus_get_property_trivial(bus, CUSTODY_LOGIN1, path, "org.freedesktop.login1.Session", name, &error, 'b', &value);
    sd_bus_error_free(&error);
    return result < 0 ? result : (value ? 1 : 0);
}

/* The boolean first argument of a signal (PrepareForSleep), or -errno. */
static inline int custody_message_read_bool(sd_bus_message *message) {
    int value = 0;
    int result = sd_bus_message_read(message, "b", &value);
    return result < 0 ? result : (value ? 1 : 0);
}

/* org.freedesktop.Notifications.Notify(app, 0, icon, summary, body, [], {"urgency": byte}, timeout):
   the notification's ID, or -errno. */
static inline int64_t custody_notify(sd_bus *bus, const char *app, const char *icon, const char *summary, const char *body,
                                     unsigned char urgency, int32_t timeout) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    int result = sd_bus_call_method(bus, "org.freedesktop.Notifications", "/org/freedesktop/Notifications",
                                    "org.freedesktop.Notifications", "Notify", &error, &reply, "susssasa{sv}i",
                                    app, (uint32_t)0, icon, summary, body, 0, 1, "urgency", "y", urgency, timeout);
    sd_bus_error_free(&error);
    if (result < 0) return result;
    uint32_t id = 0;
    result = sd_bus_message_read(reply, "u", &id);
    sd_bus_message_unref(reply);
    return result < 0 ? result : (int64_t)id;
}

#endif
