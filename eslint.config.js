// ESLint with typescript-eslint's type-aware rules: most of what goes wrong in
// this code is asynchronous (a promise nobody awaits, an async callback where a
// sync one is expected), and only the type checker sees that. Formatting is
// Prettier's (.prettierrc.json); eslint-config-prettier turns off the rules
// that would argue with it.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import tseslint from 'typescript-eslint';

// README.md's layer table ("Developing pgasynq"), enforced: each folder of src/
// imports only from its own and the layers below it. `forbidden` matches the
// specifiers a layer's files may not use (every folder of src/ is flat, so a
// relative specifier names its layer); static imports, `export … from`,
// import() and `import('…')` types are all checked, type-only ones included.
// Tests, benchmarks and examples are not layered.
const LAYERS = [
  { files: ['src/model/**'], forbidden: '^\\.\\./', rule: 'src/model/ may import only from model/' },
  { files: ['src/internal/**'], forbidden: '^\\.\\./(?!model/)', rule: 'src/internal/ may import only from internal/ and model/' },
  { files: ['src/broker/**'], forbidden: '^\\.\\./(?!internal/|model/)', rule: 'src/broker/ may import only from broker/, internal/ and model/' },
  {
    files: ['src/server/**'],
    forbidden: '^\\.\\./(?!broker/|internal/|model/)',
    rule: 'src/server/ may import only from server/, broker/, internal/ and model/',
  },
  {
    files: ['src/*.ts'],
    ignores: ['src/index.ts'],
    forbidden: '^\\./(cli/|dashboard/|testing/|index\\.js$)',
    rule: 'the public fronts (src/*.ts) may import one another, server/, broker/, internal/ and model/, not cli/, dashboard/, testing/ or index.ts',
  },
  {
    files: ['src/testing/**'],
    forbidden: '^\\.\\./(cli/|dashboard/|index\\.js$)',
    rule: 'src/testing/ (pgasynq/testing) may import the public fronts, broker/, server/, internal/ and model/, not cli/, dashboard/ or index.ts',
  },
  {
    files: ['src/dashboard/**'],
    forbidden: '^\\.\\./(server/|broker/|cli/|index\\.js$)',
    rule: 'src/dashboard/ may import only the public fronts (src/*.ts, inspector-internal.ts among them), internal/ and model/',
  },
  {
    files: ['src/cli/**'],
    forbidden: '^\\.\\./(server/|broker/|index\\.js$)',
    rule: 'src/cli/ may import only the public fronts (src/*.ts, inspector-internal.ts among them), dashboard/, internal/ and model/',
  },
];

/** One config block per layer: no-restricted-imports for declarations, no-restricted-syntax for import() (esquery's regex may not hold a `/`). */
const layerBlocks = LAYERS.map(({ files, ignores, forbidden, rule }) => ({
  files,
  ...(ignores ? { ignores } : {}),
  rules: {
    'no-restricted-imports': ['error', { patterns: [{ regex: forbidden, message: rule }] }],
    'no-restricted-syntax': [
      'error',
      {
        selector: `:matches(ImportExpression, TSImportType)[source.value=/${forbidden.replaceAll('/', '\\x2F')}/]`,
        message: rule,
      },
    ],
  },
}));

export default tseslint.config(
  // .ci/package/ is typechecked in the projects package-check.sh makes, where pgasynq resolves.
  // docs/: the site's dependencies, its build and the reference it generates.
  {
    ignores: [
      'dist/',
      'bench/.snapshot/',
      'bench/node_modules/',
      'bench/results/',
      'node_modules/',
      '.ci/package/',
      'docs/node_modules/',
      'docs/.vitepress/dist/',
      'docs/.vitepress/cache/',
      'docs/reference/',
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      // `_name` marks a binding kept for its position (a destructured field left out on purpose).
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_' }],
      // An abort signal's reason and a caught error are unknown by type, and passed on as they are.
      '@typescript-eslint/prefer-promise-reject-errors': ['error', { allowThrowingUnknown: true, allowThrowingAny: true }],
      // String(value) is where this code shows a value JSON could not: the deliberate last resort.
      '@typescript-eslint/no-base-to-string': 'off',
    },
  },
  {
    // Plain JavaScript (this file, CI scripts) is not in a tsconfig: no type-aware rules there.
    files: ['**/*.js', '**/*.mjs', 'docs/.vitepress/*.mts'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: { ...tseslint.configs.disableTypeChecked.languageOptions, globals: { process: 'readonly', console: 'readonly', URL: 'readonly' } },
  },
  {
    // Tests and benchmarks read rows of their own schemas untyped, and node:test's
    // describe() and test() return promises that the runner, not the file, awaits.
    files: ['test/**', 'bench/**', 'examples/**'],
    rules: {
      '@typescript-eslint/no-floating-promises': 'off',
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      // Assertion messages print whatever a failing value is.
      '@typescript-eslint/restrict-template-expressions': 'off',
      '@typescript-eslint/no-base-to-string': 'off',
      // Tests throw non-errors, reject with abort reasons, match escape codes, and pass async
      // handlers that need no await: each on purpose.
      '@typescript-eslint/only-throw-error': 'off',
      '@typescript-eslint/prefer-promise-reject-errors': 'off',
      '@typescript-eslint/require-await': 'off',
      'no-control-regex': 'off',
    },
  },
  {
    // The peers' adapters compile against bench/'s own install (npm run bench installs it);
    // on a fresh clone their imports do not resolve, so type-aware rules would judge `any`.
    files: ['bench/adapters/bullmq.ts', 'bench/adapters/graphile.ts', 'bench/adapters/pgboss.ts'],
    ...tseslint.configs.disableTypeChecked,
  },
  ...layerBlocks,
  prettier,
);
