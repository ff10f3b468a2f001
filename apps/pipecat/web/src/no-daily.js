// Stands for @daily-co/daily-js in the bundle: only DailyMediaManager uses it, and the page never creates one.
export default {};
