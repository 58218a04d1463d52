// AES-256-GCM with contexts reused per thread and key (see copenssl.h).
//
// OpenSSL's EVP_CIPHER_CTX may be used by one thread at a time, and keying one costs the key
// schedule and the GHASH tables: more than sealing a 4 KiB block. So each thread that uses Custody's
// ciphers gets a slot number for its life, and each key keeps a sealing and an opening context
// per slot, made by the slot's thread when it first needs it. A slot's contexts are only ever used
// by the thread holding the slot; a thread that exits gives its slot back, and the next thread to
// take it inherits the contexts (it is then the only user). Past `SLOTS` live threads, a message
// gets a context of its own.
#include "copenssl.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 64
#define TAG_SIZE 16

struct custody_gcm {
    const uint8_t *key;
    // Written only by the slot's thread; read at free, when no thread uses the key.
    EVP_CIPHER_CTX *contexts[SLOTS][2];
};

static EVP_CIPHER *aes_256_gcm;
static pthread_once_t fetched = PTHREAD_ONCE_INIT;

static void fetch_cipher(void) {
    aes_256_gcm = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
}

// Slots: a bitmap of the taken ones, and the calling thread's (-1: none yet; -2: none to have).
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t slots_taken;
static pthread_key_t slot_key;
static pthread_once_t slot_key_made = PTHREAD_ONCE_INIT;
static __thread int thread_slot = -1;

// Runs on the exiting thread (a pthread key destructor). Whatever it still seals or opens in
// later destructors gets contexts of its own: the slot may be another thread's by then.
static void give_back_slot(void *value) {
    int slot = (int)(intptr_t)value - 1;
    thread_slot = -2;
    pthread_mutex_lock(&slots_lock);
    slots_taken &= ~(UINT64_C(1) << slot);
    pthread_mutex_unlock(&slots_lock);
}

static void make_slot_key(void) {
    pthread_key_create(&slot_key, give_back_slot);
}

static int current_slot(void) {
    if (thread_slot != -1) return thread_slot;
    pthread_once(&slot_key_made, make_slot_key);
    int slot = -2;
    pthread_mutex_lock(&slots_lock);
    for (int i = 0; i < SLOTS; i++) {
        if (!(slots_taken & (UINT64_C(1) << i))) {
            slots_taken |= UINT64_C(1) << i;
            slot = i;
            break;
        }
    }
    pthread_mutex_unlock(&slots_lock);
    // Stored as slot + 1: a thread-specific value of NULL runs no destructor.
    if (slot >= 0 && pthread_setspecific(slot_key, (void *)(intptr_t)(slot + 1)) != 0) {
        give_back_slot((void *)(intptr_t)(slot + 1));
        slot = -2;
    }
    thread_slot = slot;
    return slot;
}

static EVP_CIPHER_CTX *keyed_context(const uint8_t *key, int encrypt) {
    pthread_once(&fetched, fetch_cipher);
    if (aes_256_gcm == NULL) return NULL;
    EVP_CIPHER_CTX *context = EVP_CIPHER_CTX_new();
    if (context == NULL) return NULL;
    if (EVP_CipherInit_ex2(context, aes_256_gcm, key, NULL, encrypt, NULL) != 1) {
        EVP_CIPHER_CTX_free(context);
        return NULL;
    }
    return context;
}

custody_gcm *custody_gcm_new(const uint8_t *key) {
    // No context yet: a file's key is often used by one thread for one kind of message (a file
    // written, another read), and the thread that uses it keys its own. What can fail without
    // a context (no AES-256-GCM among the loaded providers) fails here.
    pthread_once(&fetched, fetch_cipher);
    if (aes_256_gcm == NULL) {
        ERR_clear_error();
        return NULL;
    }
    custody_gcm *gcm = calloc(1, sizeof(*gcm));
    if (gcm == NULL) return NULL;
    gcm->key = key;
    return gcm;
}

void custody_gcm_free(custody_gcm *gcm) {
    if (gcm == NULL) return;
    for (int slot = 0; slot < SLOTS; slot++) {
        // EVP_CIPHER_CTX_free clears the key schedule before it frees.
        EVP_CIPHER_CTX_free(gcm->contexts[slot][0]);
        EVP_CIPHER_CTX_free(gcm->contexts[slot][1]);
    }
    free(gcm);
}

// The calling thread's context for `encrypt`, and whether it is its own (to free after use).
static EVP_CIPHER_CTX *context_for(custody_gcm *gcm, int encrypt, int *temporary) {
    int slot = current_slot();
    *temporary = slot < 0;
    if (slot < 0) return keyed_context(gcm->key, encrypt);
    EVP_CIPHER_CTX **place = &gcm->contexts[slot][encrypt];
    if (*place == NULL) *place = keyed_context(gcm->key, encrypt);
    return *place;
}

int custody_gcm_seal(custody_gcm *gcm, const uint8_t *nonce, const uint8_t *aad, size_t aad_length,
                     const uint8_t *in, size_t length, uint8_t *out, uint8_t *tag) {
    if (length > INT_MAX || aad_length > INT_MAX) return 0;
    int temporary;
    EVP_CIPHER_CTX *context = context_for(gcm, 1, &temporary);
    if (context == NULL) {
        ERR_clear_error();
        return 0;
    }
    int written = 0, done = 0;
    int ok = EVP_CipherInit_ex2(context, NULL, NULL, nonce, 1, NULL) == 1
        && (aad_length == 0 || EVP_CipherUpdate(context, NULL, &written, aad, (int)aad_length) == 1)
        && (length == 0 || EVP_CipherUpdate(context, out, &written, in, (int)length) == 1)
        && EVP_CipherFinal_ex(context, out + (length == 0 ? 0 : written), &done) == 1
        && EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_GET_TAG, TAG_SIZE, tag) == 1;
    if (temporary) EVP_CIPHER_CTX_free(context);
    if (!ok) ERR_clear_error();
    return ok;
}

int custody_gcm_open(custody_gcm *gcm, const uint8_t *nonce, const uint8_t *aad, size_t aad_length,
                     const uint8_t *in, size_t length, const uint8_t *tag, uint8_t *out) {
    if (length > INT_MAX || aad_length > INT_MAX) return 0;
    int temporary;
    EVP_CIPHER_CTX *context = context_for(gcm, 0, &temporary);
    if (context == NULL) {
        ERR_clear_error();
        if (length > 0) memset(out, 0, length);
        return 0;
    }
    uint8_t expected[TAG_SIZE];
    memcpy(expected, tag, TAG_SIZE);
    int written = 0, done = 0;
    int ok = EVP_CipherInit_ex2(context, NULL, NULL, nonce, 0, NULL) == 1
        && (aad_length == 0 || EVP_CipherUpdate(context, NULL, &written, aad, (int)aad_length) == 1)
        && (length == 0 || EVP_CipherUpdate(context, out, &written, in, (int)length) == 1)
        && EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_SET_TAG, TAG_SIZE, expected) == 1
        && EVP_CipherFinal_ex(context, out + (length == 0 ? 0 : written), &done) == 1;
    if (temporary) EVP_CIPHER_CTX_free(context);
    if (!ok) {
        ERR_clear_error();
        // No unauthenticated byte leaves this call.
        if (length > 0) memset(out, 0, length);
    }
    return ok;
}
