// libsodium: secure memory, Argon2id, X25519, randomness.
#ifndef CUSTODY_CSODIUM_SHIM_H
#define CUSTODY_CSODIUM_SHIM_H
#include <sodium.h>
#endif
