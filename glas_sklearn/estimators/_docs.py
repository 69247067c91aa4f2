"""numpydoc fragments shared by both estimators' docstrings: each parameter and attribute is documented once
(the estimators' ``__doc__`` are f-strings around them)."""

__all__ = ["ATTRIBUTES_DOC", "NOTES_DOC", "PARAMETERS_DOC", "REGRESSOR_ATTRIBUTES_DOC", "REGRESSOR_PARAMETERS_DOC",
           "SAMPLE_WEIGHT_DOC"]

PARAMETERS_DOC = """\
    module : None, torch.nn.Module, skorch net or callable, default=None
        None: an MLP (two tanh layers of 50; ``module_kwargs`` may set ``hidden_layer_sizes`` and
        ``activation``, one of "tanh", "relu", "gelu", "silu"), for 2-D tables only. A module instance is
        copied before training; with ``prefit=True`` it is used as θ0 as it is, never trained, moved or
        modified (a fitted skorch net: its ``module_``). A callable is called with ``module_kwargs``. The
        network maps the rows of ``X``, ``(n, *input_shape)``, to (n, n_outputs) for regression and to logits
        (n, n_classes) for classification: one prediction per row. ``X`` may have any rank (images
        (n, C, H, W), token ids (n, T)); with a module given, integer ``X`` reaches it as ``torch.long``
        (token ids for ``nn.Embedding``), floating ``X`` in ``dtype``. With the default MLP an integer
        table is a table of numbers. A module that takes keyword inputs or returns a ``ModelOutput``, dict or
        tuple (a Hugging Face ``transformers`` model, with or without ``peft`` adapters) is taken as it comes:
        the rows go in as ``input_ids`` with an ``attention_mask`` from ``padding_idx`` (or the config's
        ``pad_token_id``), and the ``logits`` are read (:class:`~glas_sklearn.adapters.ModelAdapter`; wrap the
        module in one to name another output). The posterior covers the trainable parameters only
        (``requires_grad=True``: LoRA adapters and a ``modules_to_save`` head under ``peft``); frozen weights
        are read in place, never copied or written (``trainable_parameters_``).
    module_kwargs : dict, optional
        Keyword arguments of the default MLP or of the callable ``module``.
    prefit : bool, default=False
        The module is already trained (inputs and targets in the user's own units; ``standardize`` is then
        ignored). The rows of ``X`` are taken to be its training rows (the curvature is built on them), so
        ``fit`` needs calibration rows the network was not trained on as ``X_cal``, ``y_cal`` and refuses
        without them: rows held out of its training rows have training residuals and would give intervals or
        sets that under-cover (benchmarks/results/prefit_calibration.md). Hold them out before training the
        network. Cross-validating a prefit estimator (``GridSearchCV``, ``cross_validate``) leaks the same
        way: every test fold was training data of the one network. The rows of ``X`` are recorded (as 8-byte
        digests, per network, in this process) so that intervals, probabilities, prediction sets or ``score``
        asked for on them raise a :class:`~glas_sklearn.PrefitLeakageWarning`; with ``n_jobs > 1`` worker
        processes a fold's warning needs the rows to have been declared in the same process, so it may not
        appear there.
    scaling : {"auto", "mean", "standard"} or float, default="auto"
        Posterior scaling: β = 1/σ² ("mean", the paper's proposal), N/σ² ("standard", Bayes) or a given β;
        for classification and the heteroscedastic likelihood "mean" is β = 1 and "standard" is β = N.
        "auto": "standard" for the heteroscedastic likelihoods (under "mean" the posterior's variance in the
        data-constrained directions swamps the noise σ(x) on the quiet rows,
        benchmarks/results/synthetic_heteroscedastic.md), "mean" otherwise.
    n_components : "auto" or int, default="auto"
        The subspace dimension d. "auto": with ``calibration="coverage"`` the smallest d whose intervals
        cover the first level on the calibration rows (up to ``max_components``); with
        ``calibration="conformal"`` d = ``max_components`` (fixed before the calibration rows are seen, so
        the conformal guarantee holds). A given d must be smaller than the number D of trainable weights.
    max_components : int, default=50
        The eigenpairs computed for ``n_components="auto"``, at most D − 1.
    sigma0 : {"auto", "eb_subspace", "eb_full", "nll"} or float, default="auto"
        Prior standard deviation (in the network's weight units), fitted at each d: "eb_subspace" by the
        paper's empirical Bayes in the subspace, "eb_full" by the full-space condition over all D weights
        (tr Σ = ‖θ0‖²). "nll" (``calibration="conformal"`` only): the σ0 in [0, σ0_EB] (σ0_EB the "eb_full"
        value; 0 gives the trained network's own predictive, the MAP probabilities) that minimises the mean
        predictive NLL (−log p_y; regression −log N(y; ŷ, σ̂²)) of half of the calibration rows, searched in
        log σ0 with both ends compared; the conformal scores use the other half (at least the rows a conformal
        quantile needs), so the guarantee holds. "auto": "eb_subspace" for ``posterior="subspace"`` (the paper)
        and for the low-rank regressor (its conformal intervals depend only on the shape of σ̂(x), and the
        larger subspace σ0 widens them more where the network extrapolates); for the low-rank classifier "nll"
        under ``calibration="conformal"`` (its probabilities depend on the scale itself, and even the full-space
        EB σ0 made them worse than the MAP network's on digits) and "eb_full" under "coverage".
    posterior : {"low_rank", "low_rank_diag", "subspace"}, default="low_rank"
        "subspace" (the paper): θ = θ0 + P z, no variance off the top-d eigenvectors. "low_rank": the Laplace
        posterior of the rank-d curvature, Σ = P diag(σ_j²) Pᵀ + σ0² (I − P Pᵀ): the directions the data do
        not constrain keep the prior's variance, so intervals widen where the network extrapolates.
        "low_rank_diag": the curvature P Λ Pᵀ plus the GGN's residual diagonal max(diag(G) − Σ_j λ_j p_j², 0)
        (exact, from per-record Jacobians of the training rows), Σ by Woodbury; σ0 and the predictive
        resolve as for "low_rank". A subclass of :class:`~glas_sklearn.posterior.ActiveSubspacePosterior` (a kind's
        class, e.g. a user's own kind) is used as it is (:func:`~glas_sklearn.posterior.resolve_posterior`).
    calibration : {"mondrian", "conformal", "coverage"} or Calibrator, default="mondrian" (classifier: "conformal")
        "mondrian" (:class:`~glas_sklearn.calibration.MondrianConformalCalibrator`, the regressor's default): split
        conformal within equal-count bins of the predictive std σ̂(x), so that the level holds within each band of
        σ̂, not only on average: 5 bins on small calibration sets when the network predicts the noise (each of
        at least ⌈1/γ⌉ − 1 rows; the homoscedastic Gaussian: five where a Kruskal–Wallis test finds its scores
        differ across them, else one below 400 rows and ⌊n / 200⌋ to 999), ⌊n / 200⌋ beyond (at most 10), each
        with a conformal quantile interpolated between ranks (coverage 1 − γ on average) and the pooled quantile
        as a floor above the calibration rows' σ̂. For the classifier the groups are the classes
        (class-conditional sets).
        "conformal" (:class:`~glas_sklearn.calibration.ConformalCalibrator`): split conformal on the calibration
        rows at a fixed d, with coverage ≥ 1 − γ for exchangeable data at any number of rows: regression
        intervals ŷ ± q σ̂ with q the ⌈(n + 1)(1 − γ)⌉-th smallest ``|y − ŷ|`` / σ̂ (per output), classification
        sets {c : 1 − p_c ≤ q} (LAC); ``ConformalCalibrator(conformity_score=...)`` takes another score.
        "coverage" (:class:`~glas_sklearn.calibration.CoverageCalibrator`, the paper): d is the smallest whose
        posterior intervals or sets cover the level. The paper's method is
        ``calibration="coverage", posterior="subspace"``.
    predictive : {"auto", "sampled", "linearized"}, default="auto"
        Push posterior samples through the network, or use the linearised network's Gaussian. "auto":
        "linearized" for the low-rank posteriors (the complement perturbs every weight: meaningful for the
        linearised network, not for the non-linear one) and "sampled" for "subspace".
    n_samples : int, default=1000
        Posterior samples (at least 2) for the sampled predictive.
    confidence_level : float or list of float, default=0.9
        Interval (or prediction-set) level(s) 1 − γ, strictly between 0 and 1; the first one is the
        calibration target.
    calibration_size : float or int, default=0.1
        Share (or number) of rows held out of ``X`` for calibration, and out of the network's training, when
        ``X_cal`` is not passed to ``fit`` (``train_indices_`` and ``calibration_indices_`` say which);
        unused with ``prefit=True``, which needs ``X_cal``.
        With a conformal calibration ("mondrian", the regressor's default, or "conformal") a share is raised,
        if need be, to the ⌈1/γ⌉ − 1 rows (9 at 90 %) that a finite conformal quantile needs at the highest
        level (one more with σ0 by "nll"; as far as the data allow); σ̂ bands then take as many rows as they
        can (a share is not raised for them). The classifier's class-conditional "mondrian" raises a share until
        the rarest class has those rows too (twice over with σ0 by "nll"), where half the rows or fewer do.
        Fewer rows than that (a number, ``X_cal``, or few rows in all or of a class) are warned about
        (``ConformalWarning``) before training: the intervals at that level are infinite, or the short classes
        in every set.
    max_epochs : int, default=500
        The most training epochs when ``prefit=False`` (all of them with ``early_stopping=False``).
    lr : "auto" or float, default="auto"
        Learning rate. "auto": 1e-3, except for steps of at least 1,024 rows on at least 8,192 rows trained on
        (what ``batch_size="auto"`` gives there), where larger steps take a larger rate: 3e-3. So "auto" is
        exactly 1e-3 (the earlier default) on every data set of fewer than 8,192 rows trained on, whatever the
        batch size; a number is used as given.
    batch_size : "auto", int or None, default="auto"
        Rows per training step (None: all rows). "auto": a twentieth of the rows trained on (rounded down), within
        [64, 200] (and at most all of them): 64 below 1,300 rows (the earlier default), 200 (scikit-learn's
        MLP) from 4,000 rows on; from 8,192 rows trained on (after the calibration and validation rows are held
        out), 1,024 rows a step (with ``lr="auto"`` at 3e-3): on ``make_friedman1`` with 8,900 and 32,400 rows
        trained on, the same interval score as 200 rows at 1e-3 in about half the training time
        (benchmarks/results/default_fit.md). A last batch of one row is merged into the batch before it (layers
        such as ``BatchNorm1d`` cannot train on a single row).
    weight_decay : float, default=0.0
        Weight decay of the optimizer.
    optimizer : {"adam", "adamw", "sgd"} or torch.optim.Optimizer subclass, default="adam"
        Built as ``optimizer(params, lr=lr, weight_decay=weight_decay)``. From 2,000 training rows on (where
        ``early_stopping="auto"`` is on), "adam" and "adamw" run in torch's fused implementation (the same
        update, one kernel for all the parameters; equal to the plain one up to rounding): on ``make_friedman1``
        with 36,000 training rows it cut the fit's CPU time from 4.7 s to 3.5 s (split 0, one torch thread, same
        epochs and interval score). Below 2,000 rows the plain update runs, so small data sets train exactly as
        before.
    standardize : "auto" or bool, default="auto"
        Standardise the inputs (and regression targets) internally; results are in the original units.
        Inputs are standardised only when they are a 2-D table of floats: "auto" leaves other inputs
        (images, integer token ids) as they are and still standardises regression targets; True refuses
        them (normalise images in the module or beforehand); False standardises nothing. Ignored with
        ``prefit=True``.
    padding_idx : int, optional
        The token id that pads integer sequences ``X`` of shape (n, T) on the right. The rows are the
        records (one prediction per sequence), so padding matters only as the model's input (e.g.
        ``nn.Embedding(padding_idx=...)`` and masked pooling; a module whose forward takes an ``attention_mask``
        gets ``X != padding_idx``, by default the config's ``pad_token_id``). At predict time (and for
        ``X_cal``), sequences padded to another length are brought to the fitted length T: shorter ones are
        padded with ``padding_idx``, longer ones cut where only padding follows. Per-position outputs (n, T, M), whose
        padded positions must not count as records, are for the lower-level
        :func:`~glas_sklearn.laplace.fit_laplace_subspace` with ``mask=X != padding_idx``.
    subsample : "auto", int or None, default="auto"
        Build the curvature on a random subsample of that many training rows (paper §2.4); None: on all of them.
        "auto": 10,000 rows when there are more, else all (so data sets below 10,000 training rows are fitted as
        before). Measured on ``make_friedman1`` with 36,000 training rows (3 splits, one torch thread,
        ``benchmarks/results/default_fit.md``): the curvature took 4.7 s instead of 31.6 s of wall time on the
        shared machine (means of two runs), the same mean interval score (4.473), coverage 89.6 % and 89.5 %.
    eigen_method : {"lanczos", "eigsh"}, default="lanczos"
        The eigen-solver: thick-restart Lanczos in torch, or scipy's ARPACK.
    device : "auto" or str, default="auto"
        "auto": where a prefit module lives, else CUDA when available, else CPU.
    dtype : {"auto", "float32", "float64"}, default="auto"
        The floating dtype of the network, the curvature and the posterior. "auto": the dtype of a prefit
        module's trainable parameters (it is never cast; with mixed precisions, as peft's float32 adapters beside
        a bfloat16 head, the widest), float32 for a network the estimator builds.
    random_state : int, RandomState or None, default=None
        Seeds weight initialisation, training order, the calibration split, Lanczos and posterior samples.
    verbose : int, default=0
        0 silent; ≥ 1 writes progress to standard error: live bars in a terminal; in a file or pipe no carriage
        returns, a line every 30 s for a long stage. Either way one line per finished stage (training, the
        eigen-solver, the posterior, σ0 with "nll", calibration) with its time and key figures, and a closing
        line saying what the fit did; the same lines are logged at INFO level (logger ``glas_sklearn``) whatever
        ``verbose``.
    early_stopping : "auto" or bool, default="auto"
        True: hold ``validation_fraction`` of the training rows out of the network's training, and stop training
        when their loss has not improved for ``n_iter_no_change`` epochs; the weights of the epoch with the
        lowest held-out loss are kept. The held-out rows are drawn from the training rows, never from the
        calibration rows (the conformal guarantee needs a network that did not look at those); they are
        still used for the curvature and σ (``validation_indices_``). The held-out loss is the likelihood's
        (the Gaussian NLL for a variance head, not the β-NLL that trains it), weighted by
        ``sample_weight``. False: every one of the ``max_epochs`` epochs is run on all training rows. "auto"
        (as ``HistGradientBoostingRegressor``'s): True from 2,000 training rows on (the rows left after the
        calibration rows are held out), False below, where holding rows out costs the network more than the
        epochs saved are worth (on the UCI sets of 308–1,599 rows early stopping made the interval score
        worse, ``benchmarks/results/default_fit.md``) and 500 epochs take seconds. With
        fewer than 2 rows on either side, training runs without stopping. Why training stopped is logged in one line
        (``logging.getLogger("glas_sklearn")``, level INFO).
    validation_fraction : float, default=0.1
        The share of the training rows held out for early stopping (⌈fraction · n⌉ rows, stratified by class
        for the classifier where possible), strictly between 0 and 1.
    n_iter_no_change : int, default=10
        Patience of early stopping: epochs in a row without an improvement of the held-out loss, each counted
        as at least 50 optimizer steps (on small data, whose epochs have fewer steps, the patience is
        ``n_iter_no_change`` × 50 steps: the loss of a small network can rest on a plateau for hundreds of
        steps before it falls again).
    tol : float, default=1e-4
        An epoch improves when its held-out loss is below the best so far by more than ``tol`` times the
        best's absolute value (relative, unlike scikit-learn's absolute ``tol``, so that it does not depend
        on the scale of the loss).
    n_threads : "auto", int or None, default="auto"
        torch's intra-op thread count while the estimator's own methods run (``fit``, ``predict``,
        ``predict_interval``, ``predict_proba``, ``predict_set``, ``sample_y``, ``score``, ``coverage_curve`` …),
        restored afterwards. "auto": one thread per whole 2²⁶ of the trainable weights × the rows of a training
        batch (``batch_size``), so one thread up to about two million weights at ``batch_size=64``, and never
        more than torch's count outside the call (``torch.get_num_threads()``, e.g. as set by ``OMP_NUM_THREADS``).
        A small network gains nothing from threads and loses up to 10× when the cores are shared with other work
        (the README example: 6.8× on two busy cores, benchmarks/results/threads_under_load.md). An int sets the
        count; None leaves torch's setting alone. The setting is process-wide: calls running at once (threads
        serving one estimator, nested calls) share the count of the first to start, and the last to finish
        restores the previous one.
    working_memory : float, default=64
        Memory in MiB that prediction may hold at once for its temporaries (as scikit-learn's
        ``working_memory``): the rows are predicted in chunks sized to it, and the posterior's weight
        samples, vectorised forwards and per-record Jacobians within a chunk too, so the memory of
        ``predict``, ``predict_interval``, ``predict_proba`` and ``predict_set`` does not grow with the number of
        rows beyond their inputs and outputs. The results do not depend on it (the weight samples are shared by
        all rows); a larger budget may be faster for big batches."""

ATTRIBUTES_DOC = """\
    module_ : torch.nn.Module
        The trained network (θ0); a module taking keyword inputs or returning a ``ModelOutput`` comes wrapped in
        a :class:`~glas_sklearn.adapters.ModelAdapter` (``module_.model`` is the module itself).
    trainable_parameters_ : dict
        Name → shape of the parameters the posterior covers: the module's trainable ones
        (``requires_grad=True``), in ``named_parameters()`` order; frozen ones stay at their values.
    n_weights_ : int
        D, their total number of entries (the posterior's dimension).
    n_components_ : int
        The subspace dimension d used.
    predictive_ : PredictiveMode
        The predictive mode used (``predictive`` with "auto" resolved): :class:`~glas_sklearn.predictive.Linearized`
        or :class:`~glas_sklearn.predictive.Sampled`; its ``name`` is the string.
    sigma0_ : float
        The prior standard deviation used at d (with "nll" the one chosen; 0 means the MAP predictive).
    beta_ : float
    likelihood_ : Likelihood
        The likelihood of the fit (the regressor's ``likelihood`` resolved; the classifier's
        :class:`~glas_sklearn.likelihoods.Categorical`): the training loss, the curvature's output Hessian and β.
    eigenvalues_ : ndarray of shape (K,)
        Top eigenvalues of the GGN (in the internal, standardised units).
    calibration_ : pandas.DataFrame
        "coverage": d, coverage, mean_width (regression: in the units of y for a single output, standardised
        units otherwise) or mean_set_size (classification), sigma0 for every d evaluated on the calibration data
        (the sampled predictive searches, evaluating a few d; the linearised one scans up to the chosen d);
        :meth:`coverage_curve` gives the whole curve on any data. "conformal": one row per level: level, d,
        quantile, coverage and mean_width / mean_set_size of the conformal intervals or sets on the
        calibration rows, sigma0. "mondrian": the same with n_bins; its quantile is the pooled one, and the
        coverage and size those of the per-band (regression) or per-class (classification) quantiles, which
        ``calibrator_.bins_`` lists.
    conformity_scores_ : ndarray or None
        "conformal" only (None otherwise): the sorted calibration scores, ``|y − ŷ|`` / σ̂ of shape (n, M)
        (regression) or 1 − p_y of shape (n,) (classification); the quantile for any level is computed from
        them at prediction time.
    calibrator_ : Calibrator
        The fitted calibrator (``calibration`` resolved to an object and fitted on the calibration rows);
        predictions and plots ask it.
    calibration_seed_ : int
        The seed of the calibration's posterior samples (predictions reuse them).
    calibration_reached_ : bool or None
        Whether the target coverage was reached (None when d was given, and with ``calibration="conformal"``).
    eigen_info_ : dict
        Products used, residuals and convergence of the eigen-solver.
    posterior_ : ActiveSubspacePosterior
    timings_ : dict
        Wall seconds of training, curvature, calibration.
    n_threads_ : int or None
        torch's intra-op thread count the estimator's methods run with (``n_threads`` resolved at fit; None:
        torch's setting left alone).
    training_loss_ : list of float
        Mean training loss per epoch (empty when prefit).
    n_iter_ : int
        Training epochs run (0 when prefit).
    loss_curve_ : list of float
        Mean training loss per epoch, on the rows trained on (empty when prefit); ``training_loss_`` is the
        same list.
    validation_scores_ : list of float or None
        With early stopping, the held-out loss after each epoch (lower is better; the Gaussian NLL per row, less
        ½ log 2π, in the internal standardised units, for a variance head); None otherwise.
    best_validation_score_ : float or None
        Its lowest value, that of the weights kept; None without early stopping.
    validation_indices_ : ndarray of int or None
        Positions among the training rows of the rows held out for early stopping (in ``X``:
        ``train_indices_[validation_indices_]`` when ``train_indices_`` is set; with ``X_cal`` passed, the rows
        of ``X`` of positive weight); None without early stopping.
    n_records_ : int
        N, the training rows the curvature averages over (with ``sample_weight``: those of positive weight; the
        curvature is normalised by their total weight); with ``subsample`` (by default on more than 10,000 rows),
        the size of the subsample.
    train_indices_, calibration_indices_ : ndarray of int or None
        Positions in ``X`` of the training rows (the network was trained on them, less ``validation_indices_``
        with early stopping; the curvature is built on all of them) and of the rows
        held out for calibration, in the order they were used; disjoint, together all of ``X`` (less the rows
        of zero ``sample_weight``, which are in neither). None when ``X_cal`` was passed (then every row of ``X``
        of positive weight is a training row).
    n_calibration_rows_ : int
        Rows used to choose d (``X_cal`` or the held-out part of ``X``), or with ``calibration="conformal"``
        those the conformal scores come from (less the σ0 tuning rows with "nll").
    n_sigma0_rows_ : int
        With σ0 by "nll": the calibration rows σ0 was tuned on (disjoint from the conformal ones); 0 otherwise.
    sigma0_rows_ : ndarray of int
        Their positions among the calibration rows (``X_cal``, or the held-out part of ``X``), sorted; the
        conformal rows are the others. Drawn from ``random_state``, stratified by class where possible.
    sigma0_search_ : Sigma0Result or None
        With "nll": the search (:func:`~glas_sklearn.calibration.tune_sigma0`: the chosen σ0, σ0_EB, the NLL
        there, at 0 and at σ0_EB, every evaluation); None otherwise.
    x_mean_, x_scale_ : ndarray or None
        The internal standardisation of the inputs (None when off or prefit).
    input_shape_ : tuple of int
        The shape of one row of ``X`` seen in fit ((n_features,) for a table, (C, H, W) for images, (T,)
        for token sequences); rows of another shape are refused at predict time.
    n_features_in_ : int
        The number of values in one row, ``prod(input_shape_)`` (the number of columns for a table).
    feature_names_in_ : ndarray of str
        Only when ``X`` has string column names (a pandas DataFrame)."""

# The regressor's own parameters (after PARAMETERS_DOC) and fitted attributes (after ATTRIBUTES_DOC).
REGRESSOR_PARAMETERS_DOC = """\
    likelihood : "auto", "gaussian", "heteroscedastic", "student_t" or Likelihood, default="auto"
        "auto": the noise level σ(x) of "heteroscedastic" when the data support one that varies with x, one
        constant σ ("gaussian") otherwise. One network is trained, the Gaussian's (its mean is that of
        ``likelihood="gaussian"``, bit for bit); on a network the estimator builds, with conformal intervals,
        ``fit`` then models the noise from its residuals on the training rows (never the calibration rows) and
        compares, by 2-fold cross-fitting, the negative log-likelihood of the residuals under that σ(x) and
        under one constant σ: σ(x) when it is lower by more than 2 standard errors and 0.02 nats per row
        (``likelihood_support_``; fewer than 100 training rows: "gaussian"). A module of your own,
        ``include_noise=True`` and the paper's ``calibration="coverage"`` take "gaussian". "gaussian":
        y = f(x) + ε with one noise level σ per output (the paper's). "heteroscedastic" on a network the
        estimator builds (:class:`~glas_sklearn.likelihoods.FittedNoiseGaussian`): the Gaussian's network, and a
        noise model σ²(x) fitted after it on its training residuals (boosted trees of ``|r|`` with the Gamma deviance,
        :func:`~glas_sklearn.likelihoods.fit_noise_model`; :meth:`predict_noise_std`), always; the curvature is
        the Gaussian's with β = N/σ² under ``scaling="auto"``, and the predictive for y is
        N(f(x), σ²(x) + σ_epi²(x)), σ_epi² the posterior variance of f (linearised J Σ Jᵀ, or sampled);
        conformal scores are normalised by σ̂² = σ²(x) + λ σ_epi² (λ fitted on the calibration rows), and
        ``calibration="coverage"`` chooses d on its Gaussian intervals. ``include_noise`` does not apply (σ(x) is
        always included). A variance head (:class:`~glas_sklearn.likelihoods.HeteroscedasticGaussian`, passed as
        an instance, or "heteroscedastic" with a module of your own): per target the network outputs a mean
        μ(x) and a variance parameter, 2k outputs in the layout it declares:
        ``HeteroscedasticGaussian(output="mean_logvar")`` (means, then log-variances) or ``output="natural"``
        (η1 = μ/σ², then η2 = −1/(2σ²) < 0; end the module with
        :class:`~glas_sklearn.likelihoods.NaturalParameterHead` to map free outputs there), trained with β-NLL
        (Seitzer et al. 2022; ``beta_nll=0.5``); its curvature is the GGN with the Fisher output Hessian
        diag(1/σ², ½) (exact Hessian in natural parameters). "student_t"
        (:class:`~glas_sklearn.likelihoods.StudentT`, ν = 4 by name; pass ``StudentT(df=...)`` for another ν):
        heavy-tailed noise; its intervals for y (``include_noise=True``) are the quantiles of f + s t_ν. Any
        :class:`~glas_sklearn.likelihoods.Likelihood` of regression that names its default conformity score plugs
        in the same way (the regressor asks the object, never its kind).
    noise_std : "auto", "calibration", "training" or float, default="auto"
        Observation-noise standard deviation σ in β: from the residuals of the held-out calibration rows
        ("calibration"), from the training residuals ("training", the paper's choice), or given (in the
        units of y). "auto" takes the calibration residuals when there are at least 30 calibration rows and
        the training residuals otherwise: a network that fits its training data closely understates σ from
        its training residuals (11–22× in σ² for the paper's 10⁶-weight concrete network), which inflates β and d
        and under-covers new data (benchmarks/results/paper_concrete.md). For small, well-regularised networks
        the training residuals are unbiased enough and give somewhat narrower intervals (benchmarks/results/uci.md:
        about 7 % better interval scores), so "training" is the better choice there. The same calibration rows
        also choose d. With ``calibration="conformal"``, "auto" is "training": σ from the calibration rows
        would make the scores depend on those rows and void the finite-sample guarantee (a warning says so
        when "calibration" is asked for).
    include_noise : bool, default=False
        False (the paper): intervals, ``predict(return_std=True)`` and ``sample_y`` describe the network
        output f(x; θ) under the weight posterior, and d is chosen so that these intervals cover y.
        True: they describe y = f(x; θ) + ε with ε ~ N(0, σ²), σ = ``noise_std_`` per output (exact
        Gaussian-mixture quantiles for the sampled predictive), and d is chosen for those intervals:
        prediction intervals in the usual statistical sense, usually reaching the level at a smaller d.
        With ``calibration="conformal"`` the intervals are for y either way; ``include_noise`` sets the
        scale the scores are normalised by, σ̂² = σ_f² (False) or σ_f² + σ² (True), which
        ``predict(return_std=True)`` returns (times ``std_scale_``)."""

REGRESSOR_ATTRIBUTES_DOC = """\
    noise_source_ : {"calibration", "training", "given", "heteroscedastic"}
        Where the constant σ (of β) came from ("heteroscedastic": a variance head's own σ(x); the noise model
        σ(x) of ``likelihood="heteroscedastic"`` is :meth:`predict_noise_std`'s).
    noise_std_ : float or ndarray
        σ in the units of y (per output for multi-output y); with a variance head: the root mean σ²(x) over the
        training rows.
    std_scale_ : ndarray of shape (n_outputs,)
        With conformal calibration ("mondrian", the default, or "conformal"): the root mean square of the
        calibration scores ``|y − ŷ|/σ̂``, the Gaussian maximum-likelihood scale by which
        ``predict(return_std=True)`` multiplies σ̂ (with several σ̂ bands, times the band's own RMS score over this
        pooled one); ones otherwise.
    y_mean_, y_scale_ : ndarray
        The internal standardisation of the targets (zeros and ones when off or prefit).
    likelihood_support_ : dict or None
        With ``likelihood="auto"`` on a network built here: the evidence of the choice, ``chosen`` (the
        likelihood's name), ``supported``, ``nll_gain`` (mean cross-fitted NLL of the residuals under one constant
        σ minus that under σ(x), nats per row, each with one scale fitted on those rows), ``nll_gain_se``, ``z``,
        ``min_gain``, ``n_rows``, ``folds``, ``rows`` ("training"), the fitted scales and ``seconds`` (the noise
        stage); None otherwise."""

# The sample_weight parameter of both estimators' fit.
SAMPLE_WEIGHT_DOC = """\
        sample_weight : array-like of shape (n_samples,), optional
            Non-negative weights of the rows of ``X``, as frequency weights: an integer weight counts the row
            that many times, a zero weight drops it. Rows of zero weight are removed first; the calibration rows
            are then held out of the others, and the weights apply to the training rows: the training loss is the
            weighted mean Σ w_i ℓ_i / Σ w_i, the curvature G = Σ_n w_n J_nᵀ H_n J_n / Σ_n w_n, σ² from the
            training residuals (regression) their weighted mean square, the input and target standardisation is
            weighted, and N in β for ``scaling="standard"`` is the total weight Σ w. The calibration rows (held
            out of ``X``, or ``X_cal``) are unweighted: split conformal's guarantee is for exchangeable,
            unweighted rows. Finite, not all zero; all ones is the same as None. In a Pipeline pass
            ``step__sample_weight=w``; with metadata routing enabled, request it with
            ``set_fit_request(sample_weight=True)``."""

NOTES_DOC = """\
    Posterior samples are drawn in weight space from a generator seeded by ``random_state`` and shared by
    all rows, so a prediction does not depend on the other rows passed with it, on their order, or on the
    global torch/numpy seeds (exactly so with ``dtype="float64"``; in float32 a matrix product may round
    differently for different numbers of rows). Sparse inputs are densified. A fitted estimator pickles
    (``pickle``, ``joblib``) with its network; one fitted on CUDA loads on a machine without CUDA, on the CPU."""
