// Sealing a small secret to a TPM 2.0 through tpm2-tss (ESAPI): the nested TPM2 unions are
// written in C here; Swift (CustodyTPM) sees plain buffers and return codes.
#ifndef CTPM_H
#define CTPM_H

#include <stddef.h>
#include <stdint.h>

typedef struct ctpm ctpm;

/// What went wrong, beyond the raw TSS2_RC (which `ctpm_describe` turns into text).
enum ctpm_kind {
    CTPM_OK = 0,
    /// The TCTI could not be loaded or the TPM did not answer.
    CTPM_UNREACHABLE = 1,
    /// The sealed object does not load under this TPM's storage key: another TPM, or this one was cleared.
    CTPM_FOREIGN = 2,
    /// The PCR policy does not hold: the bound PCRs changed (for PCR 7, the Secure Boot state).
    CTPM_POLICY = 3,
    /// The TPM is in dictionary-attack lockout.
    CTPM_LOCKOUT = 4,
    /// The authorization value was wrong (counts against the TPM's dictionary-attack counter).
    CTPM_BAD_AUTH = 5,
    /// A blob or an argument is malformed.
    CTPM_INVALID = 6,
    CTPM_OTHER = 7,
};

/// Opens the TPM behind `tcti` ("device:/dev/tpmrm0", "swtpm:port=2321", NULL for the default)
/// and starts it if it needs it.
int ctpm_open(const char *tcti, ctpm **out, uint32_t *rc);
void ctpm_close(ctpm *tpm);

/// Seals `secret` (at most 128 bytes) under the owner hierarchy's storage primary key (the
/// standard ECC P-256 template, re-created from the TPM's seed each time). `pcr_mask` bit n binds
/// the object to SHA-256 PCR n's current value (0: no binding). With `auth` (at most 32 bytes),
/// unsealing needs it and failures count against the TPM's dictionary-attack lockout; without,
/// the object is exempt (noDA). Writes the marshalled public and private parts.
int ctpm_seal(ctpm *tpm, const uint8_t *secret, size_t secret_len, uint32_t pcr_mask,
              const uint8_t *auth, size_t auth_len,
              uint8_t *public_out, size_t public_cap, size_t *public_len,
              uint8_t *private_out, size_t private_cap, size_t *private_len, uint32_t *rc);

/// Unseals what `ctpm_seal` sealed into `out` (capacity `out_cap`, at least 128); zeroes the
/// TPM library's copies.
int ctpm_unseal(ctpm *tpm, const uint8_t *public_blob, size_t public_len, const uint8_t *private_blob, size_t private_len,
                uint32_t pcr_mask, const uint8_t *auth, size_t auth_len,
                uint8_t *out, size_t out_cap, size_t *out_len, uint32_t *rc);

/// The dictionary-attack state: failures counted, the lockout threshold, seconds for one failure
/// to be forgotten, seconds of lockout-hierarchy recovery.
int ctpm_lockout_state(ctpm *tpm, uint32_t *counter, uint32_t *max_tries, uint32_t *interval, uint32_t *recovery, uint32_t *rc);

/// Text for a TSS2 return code (static storage).
const char *ctpm_describe(uint32_t rc);

#endif
