"""Differential-privacy mechanisms: pure math (numpy, scipy, stdlib), no I/O, no Kafka, no asyncio.

Import from the module that defines a name (``from mechanisms.local.rappor.encoder import RapporClient``);
this package and its subpackages re-export nothing, so a device that privatizes loads only its randomizer
(never scipy, which only the RAPPOR decoder needs). The layout, by family; a family imports only ``core``
(``tests/unit/test_architecture.py`` checks the direction and that this list names every module)::

    core/                 foundations shared by every family
        errors            MechanismError and its subclasses (the package's one base error)
        validation        parameter checks that name the parameter and its valid range
        rng               CryptoRandom (CSPRNG), SeededRandom, DerivedRandom (simulations and tests only)
        directed          directed rounding: floats on the safe side of an exact privacy loss
        framework         domains, metrics, measures, transformations, measurements, composition (OpenDP's model)
        estimates         Estimate: value, variance, standard error, normal confidence interval
    local/                local DP: each protocol's device randomizer, server estimator and variance together
        randomizer        LocalRandomizer, the base of every randomizer
        category_set      CategorySet: categories and their wire indices
        byte_sampling     exact Bernoulli and uniform samplers spending about one byte per draw
        pure_protocol     the unbiased estimator and variance of any pure protocol (p*, q*)
        consistency       Norm-Sub: estimates made non-negative and summing to the total
        protocol_choice   the lowest-variance frequency oracle among k-RR, OUE and OLH
        randomized_response/  randomizer (boolean RR, k-RR), estimator (counts, frequencies, variance)
        unary_encoding/       randomizer (OUE, SUE), estimator (support counts, frequencies, variance)
        local_hashing/        randomizer (OLH), estimator (support counts, frequencies, variance)
        rappor/               params, hashing (Bloom bits, cohorts, secrets), prr_irr (the two randomized
                              rounds), encoder (batch encoder, client, measurement), decode (server side),
                              advisor (parameters -> privacy and detectable frequency)
    central/              central DP on the server: exact noise, thresholds and private statistics
        samplers          exact discrete Laplace and Gaussian samplers
        float_grid        floats on a grid of multiples of 2^k with exact rational semantics
        threshold         thresholded noise on a histogram (stable keys)
        key_threshold     key-level thresholded noise (a key's cells released together)
        capacity_test     propose-test-release on a bounded partial's capacity
        quantile          private quantile: candidate scores and noisy selection
        theil_sen         DP Theil-Sen regression
    accounting/           what releases cost
        zcdp              zCDP to (ε, δ)-DP conversion
        accountant        PrivacyBudget, the ledger, PrivacyAccountant
        shuffle           amplification by shuffling: the central (ε, δ) of n shuffled ε₀-LDP reports (FMT21)
        shuffle_horizon   a shuffled metric's horizon charge: min(composed central (ε, δ), local horizon ε)
"""
